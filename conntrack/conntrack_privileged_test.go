//go:build privileged

package conntrack_test

import (
	"context"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
	"golang.org/x/sys/unix"
)

// natRules DNAT UDP "VIPs", a TCP VIP and a UDP node port in the node to
// the backends, as a proxier would.
const natRules = `
table ip kpt_ct {
	chain pre {
		type nat hook prerouting priority -100;
		ip daddr 10.96.0.10 udp dport 53 dnat to 10.244.1.2:5353
		ip daddr 10.96.0.11 udp dport 53 dnat to 10.244.2.2:5353
		ip daddr 10.96.0.10 tcp dport 53 dnat to 10.244.1.2:5353
		ip daddr 198.51.100.1 udp dport 30053 dnat to 10.244.2.2:5353
	}
}
table ip6 kpt_ct {
	chain pre {
		type nat hook prerouting priority -100;
		ip6 daddr fd00:96::10 udp dport 53 dnat to [fd00:244:1::2]:5353
		ip6 daddr fd00:96::11 udp dport 53 dnat to [fd00:244:2::2]:5353
	}
}
`

var (
	vip    = netip.MustParseAddr("10.96.0.10")
	vipB   = netip.MustParseAddr("10.96.0.11")
	vip6   = netip.MustParseAddr("fd00:96::10")
	vip6B  = netip.MustParseAddr("fd00:96::11")
	ep0    = netip.MustParseAddr("10.244.1.2")
	ep1    = netip.MustParseAddr("10.244.2.2")
	ep0v6  = netip.MustParseAddr("fd00:244:1::2")
	ep1v6  = netip.MustParseAddr("fd00:244:2::2")
	nodeIP = netip.MustParseAddr("198.51.100.1")
)

// key names a flow by protocol, original destination and endpoint.
type key struct {
	proto    uint8
	dst      netip.AddrPort
	endpoint netip.Addr
}

func keys(flows []conntrack.Flow) map[key]bool {
	out := map[key]bool{}
	for _, f := range flows {
		out[key{f.Protocol, f.Orig.Dst, f.Reply.Src.Addr()}] = true
	}
	return out
}

// setup builds the topology, installs the rules and sends one flow to
// each VIP and node port, checking which backend answered.
func setup(t *testing.T) *netnstest.Topology {
	netnstest.Require(t, "nf_tables", "nat", "conntrack")
	tp := netnstest.New(t, netnstest.Options{Backends: 2})
	for _, b := range tp.Backends {
		b.Serve(t, "udp", 5353)
		b.Serve(t, "tcp", 5353)
	}
	tp.Node.ExecInput(t, natRules, "nft", "-f", "-")
	for _, c := range []struct {
		proto string
		dst   netip.AddrPort
		want  string
	}{
		{"udp", netip.AddrPortFrom(vip, 53), "backend-0"},
		{"udp", netip.AddrPortFrom(vipB, 53), "backend-1"},
		{"tcp", netip.AddrPortFrom(vip, 53), "backend-0"},
		{"udp", netip.AddrPortFrom(nodeIP, 30053), "backend-1"},
		{"udp", netip.AddrPortFrom(vip6, 53), "backend-0"},
		{"udp", netip.AddrPortFrom(vip6B, 53), "backend-1"},
	} {
		r, err := tp.Client.Ask(t.Context(), c.proto, c.dst)
		if err != nil || r.Host != c.want {
			t.Fatalf("%s %s: %+v, %v; want an answer from %s", c.proto, c.dst, r, err, c.want)
		}
	}
	return tp
}

// oracle counts the flows `conntrack -L` shows in the node for a filter.
func oracle(t *testing.T, tp *netnstest.Topology, args ...string) int {
	t.Helper()
	out := tp.Node.Exec(t, "conntrack", append([]string{"-L"}, args...)...)
	return strings.Count(strings.TrimSpace(out), "\n") + min(1, len(strings.TrimSpace(out)))
}

func threadNS(t *testing.T) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestDeleteStaleInNamespace lists and deletes flows in the node's
// namespace through a handle, while the test's thread stays in its own.
func TestDeleteStaleInNamespace(t *testing.T) {
	tp := setup(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	home := threadNS(t)
	c, err := conntrack.New(conntrack.Options{NetNS: tp.Node.NS})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()
	v4, err := c.List(ctx, servicelb.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	got := keys(v4)
	for _, k := range []key{
		{17, netip.AddrPortFrom(vip, 53), ep0}, {17, netip.AddrPortFrom(vipB, 53), ep1},
		{6, netip.AddrPortFrom(vip, 53), ep0}, {17, netip.AddrPortFrom(nodeIP, 30053), ep1},
	} {
		if !got[k] {
			t.Errorf("List lacks %+v; has %v", k, v4)
		}
	}
	if n := oracle(t, tp, "-p", "udp", "--orig-dst", vip.String(), "--reply-src", ep0.String()); n != 1 {
		t.Fatalf("conntrack -L shows %d flows to %s via %s before deletion, want 1", n, vip, ep0)
	}

	n, err := c.DeleteStale(ctx, []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: []netip.AddrPort{netip.AddrPortFrom(ep1, 5353)}}})
	if err != nil || n != 1 {
		t.Fatalf("DeleteStale VIP endpoint: %d, %v; want 1", n, err)
	}
	if n := oracle(t, tp, "-p", "udp", "--orig-dst", vip.String()); n != 0 {
		t.Errorf("conntrack -L still shows %d UDP flows to %s", n, vip)
	}
	for _, stays := range [][]string{
		{"-p", "udp", "--orig-dst", vipB.String()}, // another VIP's endpoint
		{"-p", "tcp", "--orig-dst", vip.String()},  // TCP to the same VIP and endpoint
		{"-p", "udp", "--orig-dst", nodeIP.String(), "--orig-port-dst", "30053"},
	} {
		if n := oracle(t, tp, stays...); n != 1 {
			t.Errorf("conntrack -L %v: %d flows, want the unrelated flow kept", stays, n)
		}
	}

	// A node port on a node address; a filter that keeps the endpoint
	// deletes nothing; one that keeps the endpoint at another port (its
	// target port changed) deletes it.
	n, err = c.DeleteStale(ctx, []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: nodeIP, Port: 30053, Serving: []netip.AddrPort{netip.AddrPortFrom(ep1, 5353)}}})
	if err != nil || n != 0 {
		t.Fatalf("DeleteStale node port, endpoint serving: %d, %v; want 0", n, err)
	}
	n, err = c.DeleteStale(ctx, []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: nodeIP, Port: 30053, Serving: []netip.AddrPort{netip.AddrPortFrom(ep1, 5354)}}})
	if err != nil || n != 1 {
		t.Fatalf("DeleteStale node port: %d, %v; want 1", n, err)
	}
	v4, _ = c.List(ctx, servicelb.IPv4)
	got = keys(v4)
	if got[key{17, netip.AddrPortFrom(nodeIP, 30053), ep1}] || !got[key{17, netip.AddrPortFrom(vipB, 53), ep1}] {
		t.Errorf("after node port deletion: %v", v4)
	}

	// IPv6.
	n, err = c.DeleteStale(ctx, []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip6, Port: 53}})
	if err != nil || n != 1 {
		t.Fatalf("DeleteStale IPv6: %d, %v; want 1", n, err)
	}
	v6, _ := c.List(ctx, servicelb.IPv6)
	got = keys(v6)
	if got[key{17, netip.AddrPortFrom(vip6, 53), ep0v6}] || !got[key{17, netip.AddrPortFrom(vip6B, 53), ep1v6}] {
		t.Errorf("after IPv6 deletion: %v", v6)
	}
	if n := oracle(t, tp, "-f", "ipv6", "-p", "udp", "--orig-dst", vip6B.String()); n != 1 {
		t.Errorf("conntrack -L: the other IPv6 flow is gone")
	}
	if got := threadNS(t); got != home {
		t.Errorf("the test's thread moved to namespace %d", got)
	}
}

// TestZeroNetNSMeansCallersNamespace opens a client with no namespace
// option from a thread inside the node: it reads the node's table, and a
// client of the client's namespace does not see the node's flows.
func TestZeroNetNSMeansCallersNamespace(t *testing.T) {
	tp := setup(t)
	var c *conntrack.Client
	if err := tp.Node.Do(func() (err error) { c, err = conntrack.New(conntrack.Options{}); return err }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	flows, err := c.List(context.Background(), servicelb.IPv4)
	if err != nil || !keys(flows)[key{17, netip.AddrPortFrom(vip, 53), ep0}] {
		t.Fatalf("List from a client opened in the node: %v, %v", flows, err)
	}
	other, err := conntrack.New(conntrack.Options{NetNS: tp.Client.NS})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	flows, err = other.List(context.Background(), servicelb.IPv4)
	if err != nil || keys(flows)[key{17, netip.AddrPortFrom(vip, 53), ep0}] {
		t.Fatalf("the client's namespace shows the node's flow: %v, %v", flows, err)
	}
}
