//go:build privileged || vm

package ebpf_test

import (
	"path/filepath"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/internal/bpfenv"
	"github.com/kproxy-dev/kproxy/internal/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// testPrefix names every mount, cgroup and pin the tests make.
const testPrefix = "kproxy-test"

// newEnv mounts a private cgroup v2 hierarchy with a child cgroup and a
// private bpf filesystem, removed when the test ends.
func newEnv(t testing.TB) *bpfenv.Env {
	t.Helper()
	netnstest.Require(t)
	e, err := bpfenv.New(testPrefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// newSocketLB returns a socket-level Proxier for the node's namespace ns,
// attached to the env's cgroup and pinning under its bpf filesystem, with
// nftables in ns as its packet path when paired.
func newSocketLB(t testing.TB, e *bpfenv.Env, ns netns.NsHandle, paired bool) *ebpf.Proxier {
	t.Helper()
	o := ebpf.Options{Cgroup: e.Cgroup, PinPath: filepath.Join(e.BPFFS, "kproxy"), NetNS: ns}
	if paired {
		nft, err := nftables.New(nftables.Options{NetNS: ns})
		if err != nil {
			t.Fatal(err)
		}
		o.Packets = nft
	}
	p, err := ebpf.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var _ servicelb.Proxier = (*ebpf.Proxier)(nil)
