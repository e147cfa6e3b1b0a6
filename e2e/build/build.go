// Package build builds what the real-cluster tests run, from the Go module
// proxy, into the build cache of package modbuild: the Kubernetes
// release's binaries (kube-apiserver, kube-controller-manager,
// kube-scheduler, kubelet, kubectl, kubeadm, kube-proxy, agnhost), its
// e2e.test and the ginkgo that drives it, CoreDNS, and the pods' sandbox
// program. A second run finds them in the cache; a change of a building
// module's go.mod or go.sum, or of the Go version, builds them again.
//
// The building modules are modules/kubernetes and modules/coredns, beside
// this package: each pins every dependency, outside the workspace.
package build

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/testkit/modbuild"
)

// The versions built. KubernetesVersion is the release of the cluster, of
// its tests and of the kube-proxy it is compared with.
const (
	KubernetesVersion = "v1.36.3"
	CoreDNSVersion    = "v1.14.7"
)

// Kubernetes is the cache entry of the release's binaries. Its packages
// are the tools of modules/kubernetes.
func Kubernetes(e2eDir string, log io.Writer) modbuild.Build {
	pkgs := []string{
		"k8s.io/kubernetes/cmd/kube-apiserver",
		"k8s.io/kubernetes/cmd/kube-controller-manager",
		"k8s.io/kubernetes/cmd/kube-scheduler",
		"k8s.io/kubernetes/cmd/kubelet",
		"k8s.io/kubernetes/cmd/kubectl",
		"k8s.io/kubernetes/cmd/kubeadm",
		"k8s.io/kubernetes/cmd/kube-proxy",
		"k8s.io/kubernetes/test/images/agnhost",
		"k8s.io/kubernetes/test/images/regression-issue-74839",
		"github.com/onsi/ginkgo/v2/ginkgo",
	}
	major, minor, _ := strings.Cut(strings.TrimPrefix(KubernetesVersion, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	return modbuild.Build{
		Name: "kubernetes-" + KubernetesVersion, Dir: filepath.Join(e2eDir, "modules", "kubernetes"),
		Packages: pkgs, Tests: []string{"k8s.io/kubernetes/test/e2e"},
		LDFlags: fmt.Sprintf("-X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=%s"+
			" -X k8s.io/component-base/version.gitMinor=%s -X k8s.io/component-base/version.gitTreeState=clean",
			KubernetesVersion, major, minor),
		Log: log,
	}
}

// CoreDNS is the cache entry of CoreDNS.
func CoreDNS(e2eDir string, log io.Writer) modbuild.Build {
	return modbuild.Build{
		Name: "coredns-" + CoreDNSVersion, Dir: filepath.Join(e2eDir, "modules", "coredns"),
		Packages: []string{"github.com/coredns/coredns"}, Log: log,
	}
}

// KubernetesSource returns the directory of the release's source in the
// module cache (for the files the images take from it).
func KubernetesSource(ctx context.Context, e2eDir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(e2eDir, "modules", "kubernetes")
	cmd.Env = append(cmd.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locate k8s.io/kubernetes %s: %w", KubernetesVersion, err)
	}
	return strings.TrimSpace(string(out)), nil
}
