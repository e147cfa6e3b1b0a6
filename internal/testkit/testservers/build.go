//go:build linux

// Package testservers builds and runs the real servers the examples' tests
// talk to: kube-apiserver with etcd, and a Consul agent in -dev mode, all
// listening on 127.0.0.1 only, on free ports.
//
// kube-apiserver and Consul are built from the Go module proxy by small
// modules (their go.mod and go.sum pin every dependency; they sit outside
// the workspace and build with GOWORK=off): Consul's under modules/,
// kube-apiserver's the real-cluster tests' e2e/modules/kubernetes. Package
// modbuild builds and caches the binaries, keyed on the module's go.mod and
// go.sum, the linker flags and the Go version, so they are built once per
// machine. etcd is Debian's etcd-server package.
//
// Every process started here is ended by its pid on Stop, and is sent
// SIGKILL by the kernel if the test process dies first.
package testservers

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/testkit/modbuild"
)

// Server is one server this package can build.
type Server struct {
	// Name is the binary's name.
	Name string
	// Version is the server's version.
	Version string
	// Module is the directory, under modules/ or relative to it, of the
	// module that builds it.
	Module string
	// Package is the main package to build.
	Package string
	// LDFlags are extra linker flags.
	LDFlags string
}

// The servers built from the module proxy.
var (
	// KubeAPIServer is built by the real-cluster tests' Kubernetes module
	// (e2e/modules/kubernetes), of the same release: one compile serves
	// both.
	KubeAPIServer = Server{
		Name: "kube-apiserver", Version: "v1.36.3", Module: "../../../../e2e/modules/kubernetes",
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
	b := modbuild.Build{
		Name: s.Name + "-" + s.Version, Dir: filepath.Join(mods, s.Module),
		Packages: []string{s.Package}, LDFlags: s.LDFlags, Log: os.Stderr,
	}
	dir, _, err := b.Output(ctx)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, modbuild.Binary(s.Package)), nil
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
