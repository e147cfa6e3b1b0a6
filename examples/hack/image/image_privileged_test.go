//go:build privileged

package main

import (
	"archive/tar"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nsutil"
)

// goBuild builds kproxy into dir with cgo as asked and returns its path.
func goBuild(t *testing.T, dir, cgo string) string {
	t.Helper()
	out := filepath.Join(dir, "kproxy")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out,
		"-ldflags", "-s -w -X main.version=v9.8.7 -X main.commit=feedface", "../../cmd/kproxy")
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, string(b))
	return out
}

// The image of a static kproxy is an OCI layout naming it; unpacked, its
// entrypoint is the binary, which runs and prints the version it was
// built with, and it holds the CA bundle.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	bin := goBuild(t, dir, "0")
	out := filepath.Join(dir, "layout")
	digest, err := Build(Options{Binary: bin, Out: out, Tag: "kproxy:v9.8.7", Version: "v9.8.7", Revision: "feedface",
		CABundle: DefaultCABundle})
	require.NoError(t, err)

	idx, err := layout.ImageIndexFromPath(out)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im.Manifests, 1)
	desc := im.Manifests[0]
	assert.Equal(t, "kproxy:v9.8.7", desc.Annotations["org.opencontainers.image.ref.name"])
	assert.Equal(t, digest, desc.Digest)
	assert.EqualValues(t, "application/vnd.oci.image.manifest.v1+json", desc.MediaType)
	img, err := idx.Image(desc.Digest)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{BinaryPath}, cf.Config.Entrypoint)
	assert.Equal(t, "linux", cf.OS)
	assert.Equal(t, runtime.GOARCH, cf.Architecture)
	assert.Equal(t, "v9.8.7", cf.Config.Labels["org.opencontainers.image.version"])

	root := filepath.Join(dir, "root")
	unpack(t, mutate.Extract(img), root)
	got, err := exec.Command(filepath.Join(root, cf.Config.Entrypoint[0]), "--version").CombinedOutput()
	require.NoError(t, err, string(got))
	assert.True(t, strings.HasPrefix(string(got), "kproxy v9.8.7 (commit feedface, go"), string(got))
	link, err := os.Readlink(filepath.Join(root, KubeProxyPath))
	require.NoError(t, err)
	assert.Equal(t, "kproxy", link, "kube-proxy's path runs kproxy")
	bundle, err := os.ReadFile(filepath.Join(root, CABundlePath))
	require.NoError(t, err)
	host, err := os.ReadFile(DefaultCABundle)
	require.NoError(t, err)
	assert.Equal(t, host, bundle)

	// The same binary packs into the same image.
	again, err := Build(Options{Binary: bin, Out: filepath.Join(dir, "again"), Tag: "kproxy:v9.8.7", Version: "v9.8.7", Revision: "feedface",
		CABundle: DefaultCABundle})
	require.NoError(t, err)
	assert.Equal(t, digest, again)
}

// The image's kproxy trusts the CAs of its bundle: run from the unpacked
// image (chroot, in a network namespace of its own), it reaches a Consul
// served over HTTPS with a certificate of a CA the bundle holds, with no
// --consul-ca-file; from an image without the bundle it cannot, and says
// why.
func TestImageTrustsItsBundle(t *testing.T) {
	dir := t.TempDir()
	bin := goBuild(t, dir, "0")
	caPEM, leaf := testCA(t)
	bundle := filepath.Join(dir, "bundle.pem")
	require.NoError(t, os.WriteFile(bundle, caPEM, 0o644))
	for _, c := range []struct {
		name, bundle string
		trusted      bool
	}{{"with the bundle", bundle, true}, {"without a bundle", "", false}} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "layout")
			_, err := Build(Options{Binary: bin, Out: out, Tag: "kproxy:test", CABundle: c.bundle})
			require.NoError(t, err)
			idx, err := layout.ImageIndexFromPath(out)
			require.NoError(t, err)
			im, err := idx.IndexManifest()
			require.NoError(t, err)
			img, err := idx.Image(im.Manifests[0].Digest)
			require.NoError(t, err)
			root := filepath.Join(t.TempDir(), "root")
			unpack(t, mutate.Extract(img), root)

			var requests atomic.Int32
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				w.Header().Set("X-Consul-Index", "1")
				_, _ = w.Write([]byte("{}"))
			}))
			srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
			var logs syncBuffer
			var cmd *exec.Cmd
			// The listener and kproxy in a namespace of their own, which
			// lives as long as they do.
			require.NoError(t, nsutil.DoNew(func() error {
				if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
					return fmt.Errorf("lo up: %v: %s", err, out)
				}
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					return err
				}
				srv.Listener = ln
				srv.StartTLS()
				cmd = exec.Command(BinaryPath, "--source", "consul", "--consul-addr", "https://"+ln.Addr().String(),
					"--dry-run", "--metrics-bind-address=", "--healthz-bind-address=", "--bpf-pin-path=", "--node-name", "n")
				cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
				cmd.Dir = "/"
				cmd.Env = []string{"PATH=/usr/local/bin"}
				cmd.Stdout, cmd.Stderr = &logs, &logs
				return cmd.Start()
			}))
			defer srv.Close()
			defer func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}()
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) && requests.Load() == 0 && !strings.Contains(logs.String(), "unknown authority") {
				time.Sleep(50 * time.Millisecond)
			}
			if c.trusted {
				assert.Positive(t, requests.Load(), "no request reached Consul: %s", logs.String())
				assert.NotContains(t, logs.String(), "unknown authority")
			} else {
				assert.Zero(t, requests.Load(), "a request reached Consul")
				assert.Contains(t, logs.String(), "x509: certificate signed by unknown authority")
			}
		})
	}
}

// testCA returns a CA's certificate in PEM and a server certificate for
// 127.0.0.1 it signed.
func testCA(t *testing.T) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kproxy test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "consul"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
}

// syncBuffer is a bytes.Buffer for a process's output, read while it
// runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A binary that needs a dynamic loader is refused: the image has none.
func TestImageRefusesDynamic(t *testing.T) {
	// Debian's own programs are linked dynamically.
	_, err := Build(Options{Binary: "/bin/true", Out: filepath.Join(t.TempDir(), "layout"), Tag: "kproxy:x"})
	assert.ErrorContains(t, err, "linked dynamically: build it with CGO_ENABLED=0")
}

// unpack writes a flattened image's files under root.
func unpack(t *testing.T, rc io.ReadCloser, root string) {
	t.Helper()
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(t, err)
		path := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(path, 0o755))
		case tar.TypeReg:
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode))
			require.NoError(t, err)
			_, err = io.Copy(f, tr)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		case tar.TypeSymlink:
			require.NoError(t, os.Symlink(h.Linkname, path))
		default:
			t.Fatalf("unexpected entry %s (type %c)", h.Name, h.Typeflag)
		}
	}
}
