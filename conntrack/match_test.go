//go:build linux

package conntrack

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
	"golang.org/x/sys/unix"
)

var (
	vip   = netip.MustParseAddr("10.96.0.10")
	node  = netip.MustParseAddr("198.51.100.1")
	ep1   = netip.MustParseAddr("10.244.1.2")
	ep2   = netip.MustParseAddr("10.244.2.2")
	vip6  = netip.MustParseAddr("fd00:96::10")
	ep61  = netip.MustParseAddr("fd00:244:1::2")
	cli   = netip.MustParseAddrPort("198.51.100.2:40000")
	cli6  = netip.MustParseAddrPort("[fd00:c::2]:40000")
	udpNo = uint8(unix.IPPROTO_UDP)
)

// mkFlow builds a flow from client to dst translated to endpoint.
func mkFlow(proto uint8, client, dst netip.AddrPort, endpoint netip.AddrPort) Flow {
	fam := servicelb.IPv4
	if dst.Addr().Is6() {
		fam = servicelb.IPv6
	}
	return Flow{Family: fam, Protocol: proto, Orig: Tuple{Src: client, Dst: dst},
		Reply: Tuple{Src: endpoint, Dst: client}, Timeout: 30 * time.Second}
}

func (ix index) matchFlow(f Flow) bool { return ix.matches(f.Protocol, f.Orig.Dst, f.Reply.Src) }

func keep(as ...netip.AddrPort) []netip.AddrPort { return as }

var ap = netip.AddrPortFrom

func TestIndexMatches(t *testing.T) {
	stale := []servicelb.StaleFlow{
		{Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: keep(ap(ep2, 5353))},
		{Protocol: servicelb.UDP, Dst: node, Port: 30053, Serving: keep(ap(ep1, 53))},
		{Protocol: servicelb.SCTP, Dst: vip, Port: 9000}, // every flow to the VIP port
		{Protocol: servicelb.UDP, Dst: vip6, Port: 53},
		{Protocol: servicelb.UDP, Dst: netip.AddrFrom16(vip.As16()), Port: 54}, // IPv4-mapped: unmapped
		// Two filters of one frontend: a flow either keeps stays.
		{Protocol: servicelb.UDP, Dst: node, Port: 30099, Serving: keep(ap(ep1, 1))},
		{Protocol: servicelb.UDP, Dst: node, Port: 30099, Serving: keep(ap(ep2, 1))},
	}
	idx, err := buildIndex(stale)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		f    Flow
		want bool
	}{
		{"vip to an endpoint that no longer serves", mkFlow(udpNo, cli, ap(vip, 53), ap(ep1, 5353)), true},
		{"vip to a serving endpoint", mkFlow(udpNo, cli, ap(vip, 53), ap(ep2, 5353)), false},
		{"vip to a serving endpoint's other port (a target port that changed)", mkFlow(udpNo, cli, ap(vip, 53), ap(ep2, 5354)), true},
		{"untranslated flow to the vip", mkFlow(udpNo, cli, ap(vip, 53), ap(vip, 53)), true},
		{"tcp", mkFlow(unix.IPPROTO_TCP, cli, ap(vip, 53), ap(ep1, 5353)), false},
		{"other port", mkFlow(udpNo, cli, ap(vip, 5353), ap(ep1, 5353)), false},
		{"node port to an endpoint that no longer serves", mkFlow(udpNo, cli, ap(node, 30053), ap(ep2, 53)), true},
		{"node port on another address", mkFlow(udpNo, cli, ap(ep1, 30053), ap(ep2, 53)), false},
		{"node port to a serving endpoint", mkFlow(udpNo, cli, ap(node, 30053), ap(ep1, 53)), false},
		{"node port to a serving endpoint's other port", mkFlow(udpNo, cli, ap(node, 30053), ap(ep1, 8053)), true},
		{"sctp, nothing serves", mkFlow(unix.IPPROTO_SCTP, cli, ap(vip, 9000), ap(ep2, 9000)), true},
		{"sctp other vip", mkFlow(unix.IPPROTO_SCTP, cli, ap(node, 9000), ap(ep2, 9000)), false},
		{"ipv6, nothing serves", mkFlow(udpNo, cli6, ap(vip6, 53), ap(ep61, 53)), true},
		{"mapped filter", mkFlow(udpNo, cli, ap(vip, 54), ap(ep1, 1)), true},
		{"merged filters keep the first's", mkFlow(udpNo, cli, ap(node, 30099), ap(ep1, 1)), false},
		{"merged filters keep the second's", mkFlow(udpNo, cli, ap(node, 30099), ap(ep2, 1)), false},
		{"merged filters", mkFlow(udpNo, cli, ap(node, 30099), ap(vip, 1)), true},
	}
	for _, c := range cases {
		if got := idx[c.f.Family] != nil && idx[c.f.Family].matchFlow(c.f); got != c.want {
			t.Errorf("%s: match %v, want %v", c.name, got, c.want)
		}
	}
	if len(idx[servicelb.IPv6]) != 1 || len(idx[servicelb.IPv4]) != 5 {
		t.Errorf("families: v4 %d keys, v6 %d keys", len(idx[servicelb.IPv4]), len(idx[servicelb.IPv6]))
	}
}

// TestIndexAgreesWithNaiveMatching compares the index with Flow.Matches
// over random flows and filters drawn from small pools, so that many
// match. The filters name distinct frontends, where Flow.Matches of each
// filter alone is the meaning of the set.
func TestIndexAgreesWithNaiveMatching(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	v4 := []netip.Addr{vip, node, ep1, ep2}
	protos := []servicelb.Protocol{servicelb.UDP, servicelb.SCTP, servicelb.TCP}
	pick := func() netip.Addr { return v4[rng.IntN(len(v4))] }
	for round := range 200 {
		var stale []servicelb.StaleFlow
		seen := map[string]bool{}
		for range rng.IntN(8) + 1 {
			s := servicelb.StaleFlow{Protocol: protos[rng.IntN(2)], Port: uint16(rng.IntN(3) + 1), Dst: pick()}
			for _, a := range v4 {
				for _, port := range []uint16{7, 8} {
					if rng.IntN(2) == 0 {
						s.Serving = append(s.Serving, ap(a, port))
					}
				}
			}
			slices.SortFunc(s.Serving, netip.AddrPort.Compare)
			k := fmt.Sprint(s.Protocol, s.Dst, s.Port)
			if seen[k] {
				continue
			}
			seen[k] = true
			stale = append(stale, s)
		}
		idx, err := buildIndex(stale)
		if err != nil {
			t.Fatal(err)
		}
		for range 200 {
			f := mkFlow(protos[rng.IntN(3)].Number(), cli, ap(pick(), uint16(rng.IntN(3)+1)), ap(pick(), uint16(7+rng.IntN(2))))
			naive := false
			for _, s := range stale {
				naive = naive || f.Matches(s)
			}
			if got := idx[f.Family] != nil && idx[f.Family].matchFlow(f); got != naive {
				t.Fatalf("round %d: flow %s, filters %+v: index %v, naive %v", round, f, stale, got, naive)
			}
		}
	}
}

func TestBuildIndexRejectsInvalidFilters(t *testing.T) {
	good := servicelb.StaleFlow{Protocol: servicelb.UDP, Dst: vip, Port: 53}
	for name, s := range map[string]servicelb.StaleFlow{
		"unknown protocol": {Protocol: "ICMP", Dst: vip, Port: 53},
		"port 0":           {Protocol: servicelb.UDP, Dst: vip},
		"no destination":   {Protocol: servicelb.UDP, Port: 53},
		"mixed families":   {Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: keep(ap(ep61, 53))},
		"unsorted":         {Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: keep(ap(ep2, 53), ap(ep1, 53))},
		"endpoint port 0":  {Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: keep(ap(ep1, 0))},
		"zoned":            {Protocol: servicelb.UDP, Dst: netip.MustParseAddr("fe80::1%eth0"), Port: 53},
	} {
		_, err := buildIndex([]servicelb.StaleFlow{good, s})
		var se *StaleFlowError
		if !errors.Is(err, ErrInvalidStaleFlow) || !errors.As(err, &se) || se.Index != 1 {
			t.Errorf("%s: got %v, want a StaleFlowError at index 1", name, err)
		}
	}
}

// BenchmarkMatch compares the index with checking every filter, for a
// table of 20k flows and 2k filters (a whole table reconciled with 2k
// frontends).
func BenchmarkMatch(b *testing.B) {
	var stale []servicelb.StaleFlow
	for i := range 2000 {
		stale = append(stale, servicelb.StaleFlow{Protocol: servicelb.UDP, Dst: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 53,
			Serving: keep(ap(netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)}), 53))})
	}
	var flows []Flow
	for i := range 20000 {
		ep := netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)})
		flows = append(flows, mkFlow(udpNo, netip.AddrPortFrom(cli.Addr(), uint16(i)), netip.AddrPortFrom(vip, 53), netip.AddrPortFrom(ep, 53)))
	}
	idx, _ := buildIndex(stale)
	b.Run("index", func(b *testing.B) {
		for b.Loop() {
			for _, f := range flows {
				idx[servicelb.IPv4].matchFlow(f)
			}
		}
	})
	b.Run("every-filter", func(b *testing.B) {
		for b.Loop() {
			for _, f := range flows {
				for _, s := range stale {
					if f.Matches(s) {
						break
					}
				}
			}
		}
	})
}
