package servicelb

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps servicelb pure: no kernel, Kubernetes or Consul
// packages in its dependency graph.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".", "./fake").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"k8s.io/", "github.com/hashicorp/", "golang.org/x/sys/unix", "github.com/vishvananda/", "github.com/google/nftables", "syscall/js"} {
			if strings.HasPrefix(dep, bad) {
				t.Errorf("servicelb depends on %s", dep)
			}
		}
	}
}
