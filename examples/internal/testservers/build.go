// Package testservers builds and runs the real servers the examples' tests
// talk to: kube-apiserver with etcd, and a Consul agent in -dev mode, all
// listening on 127.0.0.1 only, on free ports.
//
// kube-apiserver and Consul are built from the Go module proxy by small
// modules under modules/ (their go.mod and go.sum pin every dependency;
// they sit outside the workspace and build with GOWORK=off). The binaries
// are cached in CacheDir, keyed on the server's version, its go.sum and the
// Go version, so they are built once per machine; a file lock keeps
// concurrent test processes from building the same binary twice. etcd is
// Debian's etcd-server package.
//
// Every process started here is ended by its pid on Stop, and is sent
// SIGKILL by the kernel if the test process dies first.
package testservers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Server is one server this package can build.
type Server struct {
	// Name is the binary's name.
	Name string
	// Version is the server's version.
	Version string
	// Module is the directory under modules/ that builds it.
	Module string
	// Package is the main package to build.
	Package string
	// LDFlags are extra linker flags.
	LDFlags string
}

// The servers built from the module proxy.
var (
	KubeAPIServer = Server{
		Name: "kube-apiserver", Version: "v1.36.3", Module: "kube-apiserver",
		Package: "k8s.io/kubernetes/cmd/kube-apiserver",
		LDFlags: "-X k8s.io/component-base/version.gitVersion=v1.36.3" +
			" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36",
	}
	Consul = Server{
		Name: "consul", Version: "v1.16.1", Module: "consul",
		Package: "github.com/hashicorp/consul",
		LDFlags: "-X github.com/hashicorp/consul/version.GitCommit=v1.16.1",
	}
)

// CacheDir returns where built servers are kept: $KPROXY_SERVER_CACHE, or
// kproxy/servers under the user cache directory ($XDG_CACHE_HOME or
// ~/.cache).
func CacheDir() (string, error) {
	if d := os.Getenv("KPROXY_SERVER_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("server cache: %w (set KPROXY_SERVER_CACHE)", err)
	}
	return filepath.Join(d, "kproxy", "servers"), nil
}

// ModulesDir returns the directory holding the building modules:
// $KPROXY_SERVER_MODULES, or modules/ beside this source file.
func ModulesDir() (string, error) {
	if d := os.Getenv("KPROXY_SERVER_MODULES"); d != "" {
		return d, nil
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", errors.New("testservers: cannot locate modules/ (built with -trimpath?); set KPROXY_SERVER_MODULES")
	}
	return filepath.Join(filepath.Dir(file), "modules"), nil
}

// Binary returns the path of the server's binary, building it first if the
// cache does not hold it. Building takes minutes on a cold Go cache.
func (s Server) Binary(ctx context.Context) (string, error) {
	mods, err := ModulesDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(mods, s.Module)
	key, err := s.key(ctx, dir)
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	out := filepath.Join(cache, fmt.Sprintf("%s-%s-%s", s.Name, s.Version, key), s.Name)
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", fmt.Errorf("build %s: %w", s.Name, err)
	}
	unlock, err := lock(filepath.Dir(out) + ".lock")
	if err != nil {
		return "", fmt.Errorf("build %s: %w", s.Name, err)
	}
	defer unlock()
	if _, err := os.Stat(out); err == nil {
		return out, nil // another process built it while we waited
	}
	return out, s.build(ctx, dir, out)
}

// key hashes what decides the binary: the module's go.mod and go.sum, the
// linker flags and the Go version.
func (s Server) key(ctx context.Context, dir string) (string, error) {
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", fmt.Errorf("build %s: %w", s.Name, err)
		}
		h.Write(b)
	}
	gover, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("build %s: go env GOVERSION: %w", s.Name, err)
	}
	fmt.Fprintf(h, "%s\n%s\n%s", s.Package, s.LDFlags, gover)
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

func (s Server) build(ctx context.Context, dir, out string) error {
	tmp := out + ".tmp"
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w "+s.LDFlags, "-o", tmp, s.Package)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-mod=readonly")
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s %s in %s: %w\n%s", s.Name, s.Version, dir, err, tail(string(b), 40))
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("build %s: %w", s.Name, err)
	}
	fmt.Fprintf(os.Stderr, "testservers: built %s %s in %s\n", s.Name, s.Version, time.Since(start).Round(time.Second))
	return nil
}

// lock takes an exclusive lock on the file at path.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// EtcdBinary returns the path of Debian's etcd (package etcd-server).
func EtcdBinary() (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/etcd", "/usr/sbin/etcd"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("etcd not found: install Debian's etcd-server package (apt-get install etcd-server)")
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}
