//go:build privileged || vm

package nftables_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy-dev/kproxy/internal/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// randomWorld makes random services, endpoints and nodes. Service i owns
// its addresses and node ports, so that no two services conflict; endpoint
// addresses come from a small pool, so that services share them.
type randomWorld struct {
	r *rand.Rand
}

func (w randomWorld) addr4(a, b, c, d byte) netip.Addr { return netip.AddrFrom4([4]byte{a, b, c, d}) }

func (w randomWorld) addr6(prefix uint16, i byte) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0, byte(prefix >> 8), byte(prefix), 15: i})
}

func (w randomWorld) pick(n int) int { return w.r.IntN(n) }

func (w randomWorld) chance(p float64) bool { return w.r.Float64() < p }

func (w randomWorld) service(i int) servicelb.Service {
	s := servicelb.Service{Name: fmt.Sprintf("ns%d/svc-%d", i%3, i)}
	v4, v6 := !w.chance(0.2), w.chance(0.5)
	if !v4 && !v6 {
		v4 = true
	}
	if v4 {
		s.ClusterIPs = append(s.ClusterIPs, w.addr4(10, 96, 0, byte(i)))
	}
	if v6 {
		s.ClusterIPs = append(s.ClusterIPs, w.addr6(0x96, byte(i)))
	}
	if w.chance(0.3) {
		s.ExternalIPs = append(s.ExternalIPs, w.addr4(203, 0, 114, byte(i)))
	}
	if w.chance(0.3) {
		s.LoadBalancerIPs = append(s.LoadBalancerIPs, w.addr4(203, 0, 113, byte(i)))
		if v6 {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, w.addr6(0x113, byte(i)))
		}
		if w.chance(0.5) {
			s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.PrefixFrom(w.addr4(198, 51, 100, 0), 24+w.pick(9))}
		}
	}
	protos := []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP}
	for j := range 1 + w.pick(2) {
		p := servicelb.Port{Name: fmt.Sprintf("p%d", j), Protocol: protos[w.pick(3)], Port: uint16(80 + j), TargetPort: uint16(8080 + w.pick(2))}
		if w.chance(0.4) {
			p.NodePort = uint16(30000 + 2*i + j)
		}
		s.Ports = append(s.Ports, p)
	}
	for _, pol := range []*servicelb.TrafficPolicy{&s.InternalTrafficPolicy, &s.ExternalTrafficPolicy} {
		if w.chance(0.3) {
			*pol = servicelb.PolicyLocal
		}
	}
	if w.chance(0.25) {
		s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Duration(1+w.pick(100)) * time.Second}
	}
	s.Endpoints = w.endpoints(i)
	return s
}

// endpoints returns a few endpoints of service i, some with addresses other
// services use too, some with addresses of its own.
func (w randomWorld) endpoints(i int) []servicelb.Endpoint {
	var eps []servicelb.Endpoint
	for range w.pick(6) {
		e := servicelb.Endpoint{Ready: w.chance(0.8), Serving: true, Terminating: w.chance(0.2)}
		e.NodeName = []string{"", "node", "other"}[w.pick(3)]
		if w.chance(0.3) {
			e.Weight = servicelb.Weight(uint16(w.pick(5)))
		}
		switch w.pick(4) {
		case 0:
			e.Addr = w.addr4(10, 244, byte(1+w.pick(3)), byte(2+w.pick(4)))
		case 1:
			e.Addr = w.addr6(0x244, byte(2+w.pick(6)))
		case 2:
			e.Addr = w.addr4(10, 245, byte(i), byte(1+w.pick(250)))
		default:
			e.Addr = w.addr6(0x245, byte(i))
		}
		eps = append(eps, e)
	}
	return eps
}

func (w randomWorld) node() servicelb.NodeConfig {
	n := servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{w.addr4(198, 51, 100, 1)}}
	if w.chance(0.5) {
		n.NodeIPs = append(n.NodeIPs, w.addr6(0xc, 1))
	}
	if w.chance(0.7) {
		n.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	}
	if w.chance(0.5) {
		n.ClusterCIDRs = append(n.ClusterCIDRs, netip.MustParsePrefix("fd00:244::/32"))
	}
	if w.chance(0.5) {
		n.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	}
	n.MasqueradeAll = w.chance(0.2)
	if w.chance(0.2) {
		n.MasqueradeBit = byte(w.pick(20))
	}
	return n
}

// step changes b at random: a new or replaced service, a deleted one, one
// endpoint changed, or a new node.
func (w randomWorld) step(t *testing.T, b *servicelb.Builder, pool int) string {
	switch x := w.pick(20); {
	case x == 0:
		if err := b.SetNode(w.node()); err != nil {
			t.Fatal(err)
		}
		return "node"
	case x < 4:
		name := fmt.Sprintf("ns%d/svc-%d", w.pick(pool)%3, w.pick(pool))
		b.Delete(name)
		return "delete"
	case x < 12:
		i := w.pick(pool)
		s, ok := b.State().Service(fmt.Sprintf("ns%d/svc-%d", i%3, i))
		if !ok {
			break
		}
		c := *s
		c.Endpoints = append([]servicelb.Endpoint(nil), s.Endpoints...)
		if len(c.Endpoints) > 0 && w.chance(0.5) {
			c.Endpoints = append(c.Endpoints[:0:0], c.Endpoints[1:]...)
		}
		c.Endpoints = append(c.Endpoints, w.endpoints(i)...)
		if err := b.Upsert(c); err != nil {
			t.Fatal(err)
		}
		return "endpoints"
	}
	i := w.pick(pool)
	if err := b.Upsert(w.service(i)); err != nil {
		t.Fatal(err)
	}
	return "upsert"
}

var randomSeed = flag.Uint64("nftables.seed", 0, "seed of TestRandomTransitions; 0 picks one")

// TestRandomTransitions applies 300 random changes, one sync each, then
// checks that the table equals what a fresh proxier writes for the final
// state.
func TestRandomTransitions(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	seed := *randomSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -nftables.seed %d)", seed, seed)
	w := randomWorld{r: rand.New(rand.NewPCG(seed, 1))}
	const pool = 60
	b, err := servicelb.NewBuilder(w.node())
	if err != nil {
		t.Fatal(err)
	}
	for i := range pool / 2 {
		if err := b.Upsert(w.service(i)); err != nil {
			t.Fatal(err)
		}
	}
	h, fresh := netnstest.NewHost(t, "history"), netnstest.NewHost(t, "fresh")
	p := newProxier(t, h, nftables.Options{NoConntrackCleanup: true})
	mustSync(t, p, b.State())
	kinds := map[string]int{}
	shared := 0
	for i := range 300 {
		kind := w.step(t, b, pool)
		kinds[kind]++
		if err := p.Sync(testCtx(t), b.State()); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
		if d := nftables.ModelDrift(p, b.State()); d != "" {
			t.Fatalf("after change %d (%s): %s", i, kind, d)
		}
		shared = max(shared, nftables.SharedShards(p))
	}
	t.Logf("changes: %v; %d services at the end", kinds, b.Len())
	q := newProxier(t, fresh, nftables.Options{NoConntrackCleanup: true})
	mustSync(t, q, b.State())
	if diff := cmp.Diff(canonical(t, fresh, nftables.DefaultTable), canonical(t, h, nftables.DefaultTable)); diff != "" {
		t.Errorf("table after 300 changes differs from a fresh apply of the final state (-fresh +history):\n%s", diff)
	}
	if shared == 0 {
		t.Error("no backends map ever served two service ports: the test did not cover neighbouring intervals")
	}
}
