//go:build privileged || vm

package ebpf_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/ebpf/ebpftest"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// testPrefix names every mount, cgroup and pin the tests make.
const testPrefix = "kproxy-test"

// newEnv mounts a private cgroup v2 hierarchy with a child cgroup and a
// private bpf filesystem, removed when the test ends.
func newEnv(t testing.TB) *ebpftest.Env {
	t.Helper()
	netnstest.Require(t)
	e, err := ebpftest.New(testPrefix)
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
func newSocketLB(t testing.TB, e *ebpftest.Env, ns netns.NsHandle, paired bool) *ebpf.Proxier {
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

// records keeps the messages of log records.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) has(s string) bool { return r.count(s) > 0 }

// count returns how many messages hold s.
func (r *records) count(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// mapPin returns the pin of the map name under pinPath: in the one
// directory of the maps' layout there.
func mapPin(t *testing.T, pinPath, name string) string {
	t.Helper()
	pins, err := filepath.Glob(filepath.Join(pinPath, "maps-*", name))
	require.NoError(t, err)
	require.Len(t, pins, 1, "pins of map %s under %s", name, pinPath)
	return pins[0]
}
