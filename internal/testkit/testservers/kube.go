//go:build linux

package testservers

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Kube is a running kube-apiserver with its etcd.
type Kube struct {
	// URL is the API server's address, https://127.0.0.1:<port>.
	URL string
	// Token is a bearer token in group system:masters. The serving
	// certificate is self-signed: clients skip its verification.
	Token string
	// Kubeconfig is the path of a kubeconfig file for URL and Token.
	Kubeconfig string
	// ServiceCIDR is the range cluster IPs are allocated from.
	ServiceCIDR string

	dir       string
	etcd, api *proc
}

// StartKube starts etcd and kube-apiserver on free ports of 127.0.0.1 and
// waits until the API server is ready. Stop ends both.
func StartKube(ctx context.Context) (k *Kube, err error) {
	bin, err := KubeAPIServer.Binary(ctx)
	if err != nil {
		return nil, err
	}
	etcd, err := EtcdBinary()
	if err != nil {
		return nil, err
	}
	dir, err := tempDir("kube")
	if err != nil {
		return nil, err
	}
	k = &Kube{dir: dir, ServiceCIDR: "10.96.0.0/16"}
	defer func() {
		if err != nil {
			k.Stop()
			k = nil
		}
	}()
	etcdURL, err := k.startEtcd(ctx, etcd)
	if err != nil {
		return k, err
	}
	return k, k.startAPI(ctx, bin, etcdURL)
}

func (k *Kube) startEtcd(ctx context.Context, bin string) (string, error) {
	ports, err := freePorts(2)
	if err != nil {
		return "", err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	k.etcd, err = start("etcd", k.dir, bin,
		"--name", "default", "--data-dir", filepath.Join(k.dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer)
	if err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return client, waitHTTP(wctx, k.etcd, client+"/health", "")
}

func (k *Kube) startAPI(ctx context.Context, bin, etcdURL string) error {
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return err
	}
	k.Token = hex.EncodeToString(tok[:])
	tokens := filepath.Join(k.dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(k.Token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		return err
	}
	key, err := writeRSAKey(filepath.Join(k.dir, "sa.key"))
	if err != nil {
		return err
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	k.URL = "https://127.0.0.1:" + strconv.Itoa(ports[0])
	k.api, err = start("kube-apiserver", k.dir, bin,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(ports[0]),
		"--cert-dir", filepath.Join(k.dir, "certs"),
		"--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", key, "--service-account-signing-key-file", key,
		"--service-cluster-ip-range", k.ServiceCIDR,
		"--endpoint-reconciler-type", "none")
	if err != nil {
		return err
	}
	if err := k.writeKubeconfig(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	return waitHTTP(wctx, k.api, k.URL+"/readyz", k.Token)
}

func writeRSAKey(path string) (string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", fmt.Errorf("service account key: %w", err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	return path, os.WriteFile(path, b, 0o600)
}

func (k *Kube) writeKubeconfig() error {
	k.Kubeconfig = filepath.Join(k.dir, "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: test
  context:
    cluster: test
    user: admin
current-context: test
`, k.URL, k.Token)
	return os.WriteFile(k.Kubeconfig, []byte(cfg), 0o600)
}

// Stop ends kube-apiserver and etcd, by pid, and removes their files.
func (k *Kube) Stop() {
	if k == nil {
		return
	}
	k.api.stop()
	k.etcd.stop()
	if k.dir != "" {
		_ = os.RemoveAll(k.dir)
	}
}

// Logs returns the tail of the servers' logs, for a failing test.
func (k *Kube) Logs() string {
	var out []byte
	for _, p := range []*proc{k.etcd, k.api} {
		if p == nil {
			continue
		}
		b, _ := os.ReadFile(p.log)
		out = fmt.Appendf(out, "--- %s\n%s\n", p.name, tail(string(b), 30))
	}
	return string(out)
}
