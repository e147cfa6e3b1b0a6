//go:build privileged

package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
)

func newSandbox(t *testing.T, backends int) *Sandbox {
	t.Helper()
	testutil.RequireRoot(t)
	sb, err := New(Options{Backends: backends})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Error(err)
		}
	})
	return sb
}

// The client reaches every backend directly through the node, which
// forwards, and each backend answers with its name.
func TestRouting(t *testing.T) {
	sb := newSandbox(t, 3)
	for _, b := range sb.Backends {
		if err := b.ServeHTTP(8080); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, b := range sb.Backends {
		got, err := sb.Get(ctx, fmt.Sprintf("http://%s:8080/", BackendAddr(i+1)))
		if err != nil {
			t.Fatal(err)
		}
		if got != b.Name {
			t.Errorf("backend %d answered %q, want %q", i+1, got, b.Name)
		}
	}
	// A cluster IP is not routed anywhere without a load balancer.
	c, err := sb.Distribute(ctx, "http://10.96.0.10:80/", 1)
	if err != nil {
		t.Fatal(err)
	}
	if c["error"] != 1 {
		t.Errorf("request to an unprogrammed service IP: %v, want an error", c)
	}
}

// The caller's namespace is the same before and after, and Close removes
// every namespace.
func TestCloseRemovesNamespaces(t *testing.T) {
	testutil.RequireRoot(t)
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	sb, err := New(Options{Backends: 2})
	if err != nil {
		t.Fatal(err)
	}
	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !before.Equal(after) {
		t.Fatal("New changed the caller's network namespace")
	}
	var names []string
	for _, h := range sb.Hosts() {
		names = append(names, h.NSName)
	}
	if len(names) != 4 {
		t.Fatalf("hosts %v, want 4", names)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(netnsDir, n)); !os.IsNotExist(err) {
			t.Errorf("namespace %s still there after Close: %v", n, err)
		}
	}
}

// Reap deletes a namespace left behind by a process that is gone, and
// leaves those of live processes alone.
func TestReap(t *testing.T) {
	testutil.RequireRoot(t)
	dead := fmt.Sprintf("%s%d-reap-node", Prefix, 1<<22+12345) // above pid_max's default
	live := fmt.Sprintf("%s%d-reap-node", Prefix, os.Getpid())
	for _, n := range []string{dead, live} {
		h, err := createNamed(n)
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
	}
	t.Cleanup(func() { _ = deleteNamed(dead); _ = deleteNamed(live) })
	if _, err := Reap(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, dead)); !os.IsNotExist(err) {
		t.Errorf("Reap left %s: %v", dead, err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, live)); err != nil {
		t.Errorf("Reap removed the live process's %s: %v", live, err)
	}
}
