//go:build linux

package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// fakeTable is an in-memory conntrack table that counts dumps and can
// report dumps as interrupted and deletions as failed.
type fakeTable struct {
	flows       map[uint8][]Flow
	dumps       map[uint8]int
	interrupted int   // how many of the next dumps report NLM_F_DUMP_INTR
	removeErr   error // returned by every removal
	closed      bool
}

func newFakeTable(flows ...Flow) *fakeTable {
	t := &fakeTable{flows: map[uint8][]Flow{}, dumps: map[uint8]int{}}
	for _, f := range flows {
		fam, _ := inetFamily(f.Family)
		t.flows[fam] = append(t.flows[fam], f)
	}
	return t
}

func (t *fakeTable) dump(_ context.Context, fam uint8) ([]entry, error) {
	t.dumps[fam]++
	var out []entry
	for _, f := range t.flows[fam] {
		out = append(out, entry{flow: f})
	}
	if t.interrupted > 0 {
		t.interrupted--
		return out, errInterrupted
	}
	return out, nil
}

func (t *fakeTable) remove(_ context.Context, fam uint8, e entry) error {
	if t.removeErr != nil {
		return t.removeErr
	}
	i := slices.Index(t.flows[fam], e.flow)
	if i < 0 {
		return unix.ENOENT
	}
	t.flows[fam] = slices.Delete(t.flows[fam], i, i+1)
	return nil
}

func (t *fakeTable) close() error { t.closed = true; return nil }

func sampleTable() *fakeTable {
	ap := netip.AddrPortFrom
	return newFakeTable(
		mkFlow(udpNo, cli, ap(vip, 53), ap(ep1, 53)),
		mkFlow(udpNo, cli, ap(vip, 53), ap(ep2, 53)),
		mkFlow(unix.IPPROTO_TCP, cli, ap(vip, 53), ap(ep1, 53)),
		mkFlow(udpNo, cli, ap(node, 30053), ap(ep1, 53)),
		mkFlow(udpNo, cli6, ap(vip6, 53), ap(ep61, 53)),
	)
}

// TestDeleteStaleDumpsOncePerFamily gives many filters and checks each
// family's table is read once, and only for families with filters.
func TestDeleteStaleDumpsOncePerFamily(t *testing.T) {
	ft := sampleTable()
	c := newClient(ft, nil)
	var stale []servicelb.StaleFlow
	for i := range 500 {
		stale = append(stale, servicelb.StaleFlow{Protocol: servicelb.UDP, Dst: netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)}), Port: 53})
	}
	stale = append(stale,
		servicelb.StaleFlow{Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: []netip.AddrPort{netip.AddrPortFrom(ep2, 53)}},
		servicelb.StaleFlow{Protocol: servicelb.UDP, Dst: node, Port: 30053, Serving: []netip.AddrPort{netip.AddrPortFrom(ep2, 53)}})
	n, err := c.DeleteStale(context.Background(), stale)
	if err != nil || n != 2 {
		t.Fatalf("deleted %d, %v; want 2", n, err)
	}
	if ft.dumps[unix.AF_INET] != 1 || ft.dumps[unix.AF_INET6] != 0 {
		t.Errorf("dumps %v, want one IPv4 dump and none of IPv6", ft.dumps)
	}
	if len(ft.flows[unix.AF_INET]) != 2 || len(ft.flows[unix.AF_INET6]) != 1 {
		t.Errorf("left %d IPv4 and %d IPv6 flows, want 2 and 1", len(ft.flows[unix.AF_INET]), len(ft.flows[unix.AF_INET6]))
	}
	// Filters of both families read both tables, once each.
	n, err = c.DeleteStale(context.Background(), []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53}, {Protocol: servicelb.UDP, Dst: vip6, Port: 53}})
	if err != nil || n != 2 || ft.dumps[unix.AF_INET] != 2 || ft.dumps[unix.AF_INET6] != 1 {
		t.Errorf("both families: deleted %d, %v, dumps %v", n, err, ft.dumps)
	}
}

func TestDeleteStaleNothingToDo(t *testing.T) {
	ft := sampleTable()
	c := newClient(ft, nil)
	if n, err := c.DeleteStale(context.Background(), nil); n != 0 || err != nil || len(ft.dumps) != 0 {
		t.Errorf("empty: %d, %v, dumps %v", n, err, ft.dumps)
	}
	bad := []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53}, {Protocol: servicelb.UDP}}
	if n, err := c.DeleteStale(context.Background(), bad); n != 0 || !errors.Is(err, ErrInvalidStaleFlow) || len(ft.dumps) != 0 {
		t.Errorf("invalid: %d, %v, dumps %v; want nothing read or deleted", n, err, ft.dumps)
	}
}

func TestDeleteStaleRetriesInterruptedDumps(t *testing.T) {
	ft := sampleTable()
	ft.interrupted = 2
	c := newClient(ft, nil)
	stale := []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53}}
	n, err := c.DeleteStale(context.Background(), stale)
	if err != nil || n != 2 || ft.dumps[unix.AF_INET] != 3 {
		t.Errorf("deleted %d, %v after %d dumps; want 2, nil after 3", n, err, ft.dumps[unix.AF_INET])
	}
	ft = sampleTable()
	ft.interrupted = 100
	c = newClient(ft, nil)
	n, err = c.DeleteStale(context.Background(), stale)
	var op *OpError
	if !errors.Is(err, ErrDumpInterrupted) || !errors.As(err, &op) || op.Family != servicelb.IPv4 {
		t.Errorf("always interrupted: %v", err)
	}
	if n != 2 || ft.dumps[unix.AF_INET] != MaxAttempts {
		t.Errorf("always interrupted: deleted %d in %d dumps; want 2 (best effort) in %d", n, ft.dumps[unix.AF_INET], MaxAttempts)
	}
}

func TestDeleteStaleReportsDeleteFailures(t *testing.T) {
	ft := sampleTable()
	ft.interrupted = 1
	ft.removeErr = unix.EPERM
	c := newClient(ft, nil)
	n, err := c.DeleteStale(context.Background(), []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53}})
	if n != 0 || !errors.Is(err, unix.EPERM) || errors.Is(err, ErrDumpInterrupted) || !strings.Contains(err.Error(), "10.96.0.10:53") {
		t.Errorf("got %d, %v; want the failures naming the flows, and no dump failure after a good retry", n, err)
	}
	// A flow that vanished meanwhile counts as deleted.
	ft = sampleTable()
	ft.removeErr = unix.ENOENT
	c = newClient(ft, nil)
	if n, err := c.DeleteStale(context.Background(), []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53}}); n != 2 || err != nil {
		t.Errorf("vanished flows: %d, %v; want 2, nil", n, err)
	}
}

func TestListRetriesAndConverts(t *testing.T) {
	ft := sampleTable()
	ft.interrupted = 1
	c := newClient(ft, nil)
	flows, err := c.List(context.Background(), servicelb.IPv6)
	if err != nil || len(flows) != 1 || flows[0].Reply.Src.Addr() != ep61 || ft.dumps[unix.AF_INET6] != 2 {
		t.Fatalf("List: %v, %v, dumps %v", flows, err, ft.dumps)
	}
	if _, err := c.List(context.Background(), 5); !errors.Is(err, ErrInvalidFamily) {
		t.Errorf("family 5: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.List(ctx, servicelb.IPv4); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	c.Close()
	if _, err := c.List(context.Background(), servicelb.IPv4); !errors.Is(err, ErrClosed) || !ft.closed {
		t.Errorf("after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestNewInTheCallersNamespace: zero and netns.None() both mean the
// caller's namespace.
func TestNewInTheCallersNamespace(t *testing.T) {
	for _, ns := range []netns.NsHandle{0, netns.None()} {
		c, err := New(Options{NetNS: ns})
		if err != nil {
			t.Fatalf("New(NetNS: %d): %v", ns, err)
		}
		c.Close()
	}
}
