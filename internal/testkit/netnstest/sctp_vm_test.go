//go:build vm

package netnstest_test

import (
	"errors"
	"net/netip"
	"regexp"
	"strconv"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestSCTPEcho asks SCTP echo servers on every backend from the client,
// over IPv4 and IPv6, and checks a closed port is refused (SCTP abort).
func TestSCTPEcho(t *testing.T) {
	netnstest.Require(t, "sctp")
	tp := netnstest.New(t, netnstest.Options{Backends: 2})
	for _, b := range tp.Backends {
		b.Serve(t, "sctp", 9000)
	}
	for _, b := range tp.Backends {
		for _, pair := range [][2]netip.Addr{{b.IPv4, tp.Client.IPv4}, {b.IPv6, tp.Client.IPv6}} {
			dst := netip.AddrPortFrom(pair[0], 9000)
			r, err := tp.Client.Ask(t.Context(), "sctp", dst)
			if err != nil {
				t.Fatalf("sctp %s: %v", dst, err)
			}
			if r.Host != b.Name || r.Client.Addr() != pair[1] {
				t.Errorf("sctp %s: reply %+v, want host %s from %s", dst, r, b.Name, pair[1])
			}
			if got := tp.Client.Count(t, "sctp", dst, 20); got[b.Name] != 20 {
				t.Errorf("sctp %s: counts %v", dst, got)
			}
			_, err = tp.Client.Ask(t.Context(), "sctp", netip.AddrPortFrom(pair[0], 9001))
			if !errors.Is(err, netnstest.ErrRefused) {
				t.Errorf("sctp closed port on %s: got %v, want refused", pair[0], err)
			}
		}
	}
	from := netip.MustParsePrefix("198.51.100.9/24")
	tp.Client.AddAddress(t, from)
	r, err := tp.Client.Ask(t.Context(), "sctp", netip.AddrPortFrom(tp.Backends[0].IPv4, 9000),
		netnstest.FromAddr(from.Addr()), netnstest.FromPort(40009))
	if err != nil || r.Client != netip.AddrPortFrom(from.Addr(), 40009) {
		t.Errorf("sctp from %s:40009: %+v, %v", from.Addr(), r, err)
	}
}

// TestSCTPRecoversFromLoss: the node, which routes between the client
// and the backend, drops every other SCTP packet carrying data to the
// server, so every ask loses its request once; the hosts' short SCTP
// retransmission timers still complete each ask within DefaultTimeout.
func TestSCTPRecoversFromLoss(t *testing.T) {
	netnstest.Require(t, "sctp", "nf_tables")
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	b := tp.Backends[0]
	b.Serve(t, "sctp", 9000)
	tp.Node.Exec(t, "nft", "add table inet loss; "+
		"add chain inet loss forward { type filter hook forward priority 0; }; "+
		"add rule inet loss forward sctp dport 9000 sctp chunk data exists numgen inc mod 2 == 0 counter drop")
	const n = 10
	for _, a := range []netip.Addr{b.IPv4, b.IPv6} {
		if got := tp.Client.Count(t, "sctp", netip.AddrPortFrom(a, 9000), n); got[b.Name] != n {
			t.Errorf("sctp %s: counts %v", a, got)
		}
	}
	out := tp.Node.Exec(t, "nft", "list chain inet loss forward")
	dropped := 0
	if m := regexp.MustCompile(`counter packets (\d+)`).FindStringSubmatch(out); m != nil {
		dropped, _ = strconv.Atoi(m[1])
	}
	if dropped < 2*n-1 {
		t.Errorf("the node dropped fewer than one packet per ask:\n%s", out)
	}
}

// TestTopologyInGuest checks the topology on the guest's kernel as well:
// TCP and UDP both ways over both families.
func TestTopologyInGuest(t *testing.T) {
	netnstest.Require(t, "nf_tables", "conntrack")
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	b := tp.Backends[0]
	for _, proto := range []string{"tcp", "udp"} {
		b.Serve(t, proto, 8080)
		for _, a := range []netip.Addr{b.IPv4, b.IPv6} {
			if got := tp.Client.Count(t, proto, netip.AddrPortFrom(a, 8080), 50); got[b.Name] != 50 {
				t.Errorf("%s %s: counts %v", proto, a, got)
			}
		}
	}
}
