//go:build linux

package nftables

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func renderer(t *testing.T, o Options) *Proxier {
	t.Helper()
	p, err := newProxier(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func state(t *testing.T, node servicelb.NodeConfig, svcs ...servicelb.Service) *servicelb.State {
	t.Helper()
	st, err := servicelb.NewState(node, svcs...)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func eps(node string, ss ...string) []servicelb.Endpoint {
	out := make([]servicelb.Endpoint, len(ss))
	for i, s := range ss {
		out[i] = servicelb.Endpoint{Addr: netip.MustParseAddr(s), NodeName: node}
	}
	return out
}

var testNode = servicelb.NodeConfig{
	NodeName:     "node-a",
	NodeIPs:      addrs("192.0.2.1", "2001:db8::1"),
	ClusterCIDRs: prefixes("10.244.0.0/16", "fd00:244::/48"),
}

// goldenCases are the states whose renderings testdata holds.
func goldenCases() map[string]func(t *testing.T) *servicelb.State {
	return map[string]func(t *testing.T) *servicelb.State{
		"basic": func(t *testing.T) *servicelb.State {
			return state(t, testNode, servicelb.Service{
				Name: "default/web", ClusterIPs: addrs("10.96.0.10"),
				Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
				Endpoints: eps("", "10.244.1.2", "10.244.2.2", "10.244.3.2"),
			})
		},
		"dualstack-nodeport": func(t *testing.T) *servicelb.State {
			return state(t, testNode, servicelb.Service{
				Name: "default/dns", ClusterIPs: addrs("10.96.0.53", "fd00:96::53"), ExternalIPs: addrs("198.51.100.53"),
				Ports: []servicelb.Port{
					{Name: "dns", Protocol: servicelb.UDP, Port: 53, NodePort: 30053},
					{Name: "dns-tcp", Protocol: servicelb.TCP, Port: 53, NodePort: 30053},
				},
				Endpoints: eps("node-a", "10.244.1.5", "fd00:244:0:1::5"),
			})
		},
		"local-policies": func(t *testing.T) *servicelb.State {
			return state(t, testNode, servicelb.Service{
				Name: "shop/cart", ClusterIPs: addrs("10.96.1.1"), LoadBalancerIPs: addrs("203.0.113.7"),
				ExternalTrafficPolicy: servicelb.PolicyLocal, InternalTrafficPolicy: servicelb.PolicyLocal,
				Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 443, NodePort: 31443}},
				Endpoints: append(eps("node-a", "10.244.1.7"), eps("node-b", "10.244.2.7")...),
			})
		},
		"affinity-weights": func(t *testing.T) *servicelb.State {
			e := eps("", "10.244.1.8", "10.244.2.8", "10.244.3.8")
			e[0].Weight, e[2].Weight = servicelb.Weight(5), servicelb.Weight(2)
			return state(t, testNode, servicelb.Service{
				Name: "shop/session", ClusterIPs: addrs("10.96.1.2"),
				Affinity:  servicelb.SessionAffinity{ClientIP: true, Timeout: 10 * time.Minute},
				Ports:     []servicelb.Port{{Protocol: servicelb.SCTP, Port: 9000}},
				Endpoints: e,
			}, servicelb.Service{
				Name: "shop/weighted", ClusterIPs: addrs("10.96.1.3"),
				Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}},
				Endpoints: e,
			})
		},
		"detect-node-cidr": func(t *testing.T) *servicelb.State {
			n := testNode
			n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalByNodeCIDR, NodeCIDRs: prefixes("10.244.1.0/24")}
			return state(t, n, detectLocalService())
		},
		"detect-bridge": func(t *testing.T) *servicelb.State {
			n := testNode
			n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalByBridgeInterface, BridgeInterface: "cbr0"}
			return state(t, n, detectLocalService())
		},
		"detect-prefix": func(t *testing.T) *servicelb.State {
			n := testNode
			n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"}
			return state(t, n, detectLocalService(), servicelb.Service{
				Name: "shop/none", ClusterIPs: addrs("10.96.1.5"), ExternalTrafficPolicy: servicelb.PolicyLocal,
				Ports:     []servicelb.Port{{Protocol: servicelb.UDP, Port: 53, NodePort: 30053}},
				Endpoints: eps("node-b", "10.244.2.9"),
			})
		},
		"firewall": func(t *testing.T) *servicelb.State {
			n := testNode
			n.ServiceCIDRs, n.MasqueradeAll, n.MasqueradeBit = prefixes("10.96.0.0/16", "fd00:96::/112"), true, 3
			return state(t, n, servicelb.Service{
				Name: "edge/api", ClusterIPs: addrs("10.96.2.1", "fd00:96::2:1"), LoadBalancerIPs: addrs("203.0.113.9", "2001:db8:9::9"),
				SourceRanges: prefixes("198.51.100.0/24", "198.51.100.128/25", "2001:db8::/48"),
				Ports:        []servicelb.Port{{Protocol: servicelb.TCP, Port: 443}},
				Endpoints:    eps("", "10.244.9.9", "fd00:244:0:9::9"),
			}, servicelb.Service{
				Name: "edge/none", ClusterIPs: addrs("10.96.2.2"),
				Ports: []servicelb.Port{{Protocol: servicelb.UDP, Port: 123}},
			})
		},
	}
}

// detectLocalService is a dual-stack service whose chains tell every
// origin apart: the golden renderings of the local-traffic detections.
func detectLocalService() servicelb.Service {
	return servicelb.Service{
		Name: "shop/cart", ClusterIPs: addrs("10.96.1.1", "fd00:96::1:1"), ExternalTrafficPolicy: servicelb.PolicyLocal,
		Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 443, NodePort: 31443}},
		Endpoints: append(eps("node-a", "10.244.1.7", "fd00:244:0:1::7"), eps("node-b", "10.244.2.7", "fd00:244:0:2::7")...),
	}
}

// TestRenderGolden compares Render with the files in testdata; run with
// -update to rewrite them. The privileged tests check that `nft -f` loads
// such text into the table Sync writes.
func TestRenderGolden(t *testing.T) {
	for name, mk := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			got, err := renderer(t, Options{}).Render(mk(t))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", name+".nft")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("Render differs from %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

// TestRenderRefuses: what the table cannot express is refused with the
// error Capabilities.CheckPort gives, the same on every backend.
func TestRenderRefuses(t *testing.T) {
	rr := servicelb.Service{Name: "a/rr", ClusterIPs: addrs("10.96.0.1"), Scheduler: servicelb.SchedulerMaglev,
		Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}}}
	refused := func(st *servicelb.State, kind error) {
		t.Helper()
		_, err := renderer(t, Options{}).Render(st)
		var ve *servicelb.ValidationError
		if !errors.Is(err, kind) || !errors.As(err, &ve) || ve.Service != "a/rr" {
			t.Fatalf("Render error = %v, want a *servicelb.ValidationError of a/rr wrapping %v", err, kind)
		}
		caps := capabilities()
		if want := caps.CheckPort(st.Ports()[0]); err.Error() != want.Error() {
			t.Errorf("Render error = %q, want CheckPort's %q", err, want)
		}
	}
	refused(state(t, testNode, rr), servicelb.ErrUnsupported)
	rr.Scheduler = servicelb.SchedulerRandom
	if _, err := renderer(t, Options{}).Render(state(t, testNode, rr)); err != nil {
		t.Errorf("random scheduler: %v", err)
	}
	many := rr
	for i := range buckets + 1 {
		many.Endpoints = append(many.Endpoints, servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)})})
	}
	refused(state(t, testNode, many), servicelb.ErrCapacity)
	many.Endpoints = many.Endpoints[:buckets]
	if _, err := renderer(t, Options{}).Render(state(t, testNode, many)); err != nil {
		t.Errorf("%d endpoints: %v", buckets, err)
	}
	if _, err := newProxier(Options{Table: "no spaces"}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("bad table name: %v, want ErrInvalidOptions", err)
	}
}

// batchFor plans the change from a to b on the model of a and returns the
// batch a sync would send.
func batchFor(t *testing.T, a, b *servicelb.State) *nfnl.Batch {
	t.Helper()
	p := newPlanner("kproxy", DefaultAffinitySize)
	m, err := p.build(a)
	if err != nil {
		t.Fatal(err)
	}
	ch := servicelb.Diff(a, b)
	s, err := p.plan(m, &ch, b)
	if err != nil {
		t.Fatal(err)
	}
	var batch nfnl.Batch
	if err := s.delta(m).batch("kproxy", &batch); err != nil {
		t.Fatal(err)
	}
	return &batch
}

func ops(b *nfnl.Batch) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// TestChangesWriteOnlyWhatDiffers: an endpoint change rewrites map
// elements only, never a rule; a new service of a shape and a spread in
// use adds elements alone, and one of a new spread adds its bucket set
// and rewrites the balancing chain that reads it; a removed one takes
// its elements away; no change sends nothing.
func TestChangesWriteOnlyWhatDiffers(t *testing.T) {
	var svcs []servicelb.Service
	for i := range 20 {
		svcs = append(svcs, servicelb.Service{
			Name: fmt.Sprintf("ns/svc%d", i), ClusterIPs: addrs(fmt.Sprintf("10.96.0.%d", i+1)),
			Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}},
			Endpoints: eps("", fmt.Sprintf("10.244.%d.2", i), fmt.Sprintf("10.244.%d.3", i)),
		})
	}
	a := state(t, testNode, svcs...)
	change := func(f func(*servicelb.Builder)) *servicelb.State {
		b := a.Edit()
		f(b)
		return b.State()
	}
	if got := ops(batchFor(t, a, a)); len(got) != 0 {
		t.Errorf("no change: %v", got)
	}
	moved := change(func(b *servicelb.Builder) {
		s := svcs[7]
		s.Endpoints = eps("", "10.244.7.2", "10.244.7.9")
		b.Upsert(s)
	})
	for _, op := range ops(batchFor(t, a, moved)) {
		if !strings.Contains(op, " elements ") {
			t.Errorf("endpoint change sends %q: only elements may change", op)
		}
	}
	shape := "verdicts4/outside-cluster-masq/pod-cluster/node-cluster-masq"
	for _, tc := range []struct {
		name string
		eps  []servicelb.Endpoint
		want []string
	}{
		{"a service of a spread in use", eps("", "10.244.99.2", "10.244.99.3"), []string{
			"add elements inet kproxy buckets4/cluster-2",
			"add elements inet kproxy endpoints4",
			"add elements inet kproxy " + shape,
		}},
		{"a service of a new spread", eps("", "10.244.99.2"), []string{
			"add set inet kproxy buckets4/cluster-1",
			"flush chain inet kproxy cluster4",
			"add rule inet kproxy cluster4",
			"add elements inet kproxy buckets4/cluster-1",
			"add elements inet kproxy endpoints4",
			"add elements inet kproxy " + shape,
		}},
	} {
		added := change(func(b *servicelb.Builder) {
			b.Upsert(servicelb.Service{Name: "ns/new", ClusterIPs: addrs("10.96.1.1"),
				Ports: []servicelb.Port{{Protocol: servicelb.UDP, Port: 53}}, Endpoints: tc.eps})
		})
		got := ops(batchFor(t, a, added))
		for _, w := range tc.want {
			if !slices.ContainsFunc(got, func(op string) bool { return strings.HasPrefix(op, w) }) {
				t.Errorf("%s: batch lacks %q:\n%s", tc.name, w, strings.Join(got, "\n"))
			}
		}
		for _, op := range got {
			if strings.Contains(op, "chain") && !strings.HasSuffix(op, " cluster4") {
				t.Errorf("%s: batch touches a chain other than the balancing one: %q", tc.name, op)
			}
		}
	}
	removed := change(func(b *servicelb.Builder) { b.Delete("ns/svc3") })
	got := strings.Join(ops(batchFor(t, a, removed)), "\n")
	for _, w := range []string{"delete elements inet kproxy " + shape, "delete elements inet kproxy endpoints4", "delete elements inet kproxy buckets4/cluster-2"} {
		if !strings.Contains(got, w) {
			t.Errorf("removing a service: batch lacks %q:\n%s", w, got)
		}
	}
	if strings.Contains(got, "chain") || strings.Contains(got, " set ") {
		t.Errorf("removing one service touches chains or sets:\n%s", got)
	}
}

func TestSlotTable(t *testing.T) {
	tb := newSlotTable()
	k := func(name string) slotKey {
		return slotKey{port: servicelb.ServicePortKey{Service: name, Family: servicelb.IPv4}}
	}
	x := tb.begin()
	a, err := x.get(k("a"))
	if err != nil {
		t.Fatal(err)
	}
	if a != k("a").home() {
		t.Errorf("slot %d, want the home slot %d", a, k("a").home())
	}
	// A key whose home is taken probes onward.
	clash := slotKey{port: servicelb.ServicePortKey{Service: "a", Family: servicelb.IPv6}}
	if s, _ := x.get(clash); s != clash.home() {
		t.Errorf("another family does not share slots: %d", s)
	}
	x.taken[0][k("b").home()] = true
	if s, _ := x.get(k("b")); s != (k("b").home()+1)%maxSlots {
		t.Errorf("taken home: slot %d, want the next one", s)
	}
	// Nothing reaches the table before commit.
	if len(tb.used[0])+len(tb.used[1]) != 0 {
		t.Fatal("uncommitted assignments leaked into the table")
	}
	x.commit()
	if n := len(tb.used[0]) + len(tb.used[1]); n != 4 { // b's home, taken by hand, with the three assigned
		t.Fatalf("committed %d slots, want 4", n)
	}
	// A slot in use is not given to another key; a released one is, once
	// the release commits, or in the transaction that released it.
	y := tb.begin()
	if s, _ := y.get(slotKey{port: servicelb.ServicePortKey{Service: "c", Family: servicelb.IPv4}}); s == a {
		t.Errorf("a slot in use given again")
	}
	y.release(servicelb.IPv4, a)
	if !tb.used[0][a] {
		t.Error("a release reached the table before commit")
	}
	if s, _ := y.get(k("a")); s != a {
		t.Errorf("a slot released in the transaction not taken again: %d, want %d", s, a)
	}
	y.release(servicelb.IPv4, a)
	y.commit()
	if tb.used[0][a] {
		t.Error("released slot still taken")
	}
	// A family whose slots are all taken refuses another port.
	for s := range uint32(maxSlots) {
		tb.used[0][s] = true
	}
	_, err = tb.begin().get(k("full"))
	var ve *servicelb.ValidationError
	if !errors.Is(err, servicelb.ErrCapacity) || !errors.As(err, &ve) || ve.Service != "full" {
		t.Errorf("all slots taken: %v, want a *servicelb.ValidationError of service full wrapping ErrCapacity", err)
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{chainInternal(servicelb.ServicePortKey{Service: "a/b", Port: "", Family: servicelb.IPv4}), "svc4-a/b/"},
		{chainInternal(servicelb.ServicePortKey{Service: "a", Port: "b", Family: servicelb.IPv4}), "svc4-a/b"},
		{chainLocal(servicelb.ServicePortKey{Service: "x", Port: "p", Family: servicelb.IPv6}), "local6-x/p"},
		{bucketSet(servicelb.IPv6, true, 7).name(), "buckets6/local-7"},
		{bucketSet(servicelb.IPv4, false, buckets).name(), "buckets4/cluster-4095"},
		{shapeSet(servicelb.IPv4, servicelb.Verdicts{
			servicelb.FromOutside: {Action: servicelb.ToLocal},
			servicelb.FromPod:     {Action: servicelb.ToCluster},
			servicelb.FromNode:    {Action: servicelb.Reject, Masquerade: true},
		}).name(), "verdicts4/outside-local/pod-cluster/node-reject-masq"},
		{chainBalance(servicelb.IPv6, false), "cluster6"},
		{fixedSet(kindFirewallPass, servicelb.IPv4).name(), "firewall-allow4"},
		{nftDuration(3 * time.Hour), "3h"},
		{nftDuration(90*time.Second + 5*time.Millisecond), "1m30s5ms"},
		{rangeText(netip.MustParseAddr("10.0.0.0"), netip.MustParseAddr("10.0.255.255")), "10.0.0.0/16"},
		{rangeText(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.1")), "10.0.0.1"},
		{rangeText(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.5")), "10.0.0.1-10.0.0.5"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	for _, name := range []string{"kproxy", "a.b", "_x", "k8s/proxy-1"} {
		if !validTableName(name) {
			t.Errorf("%q refused", name)
		}
	}
	for _, name := range []string{"", "1a", "a b", "-x", "a:b"} {
		if validTableName(name) {
			t.Errorf("%q accepted", name)
		}
	}
}

// TestEndpointChangeKeepsThePortsRules: a change of a port's endpoints
// alone rewrites no chain and no set: an endpoint replaced changes a few
// elements of the endpoints map (its bucket, and the few its successor
// displaces: bucketOwners), wherever its address sorts; one added moves
// the frontend to the bucket set of one bucket more, and adds its bucket
// and moves a few. Planning the change with its delta costs allocations
// for the port, not for the table.
func TestEndpointChangeKeepsThePortsRules(t *testing.T) {
	ips := make([]string, 50)
	for i := range ips {
		ips[i] = fmt.Sprintf("10.244.1.%d", 2*i+2)
	}
	svc := servicelb.Service{Name: "ns/web", ClusterIPs: addrs("10.96.0.1"),
		Ports: []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80}}, Endpoints: eps("", ips...)}
	other := servicelb.Service{Name: "ns/other", ClusterIPs: addrs("10.96.0.2"),
		Ports: []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80}}, Endpoints: eps("", ips[:3]...)}
	b, err := servicelb.NewBuilder(testNode)
	require.NoError(t, err)
	require.NoError(t, b.Upsert(svc))
	require.NoError(t, b.Upsert(other))
	a := b.State()
	p := newPlanner("kproxy", DefaultAffinitySize)
	m, err := p.build(a)
	require.NoError(t, err)
	endpoints := fixedSet(kindEndpoints, servicelb.IPv4)
	change := func(next *servicelb.State, rewritten ...string) *delta {
		ch := servicelb.Diff(a, next)
		s, err := p.plan(m, &ch, next)
		require.NoError(t, err)
		require.Len(t, s.changed, 1)
		d := s.delta(m)
		assert.Empty(t, d.delete, "chains deleted")
		assert.Empty(t, d.create, "chains created")
		assert.Equal(t, rewritten, d.flush, "chains rewritten")
		assert.Equal(t, rewritten, chainNamesOf(d.write), "chains rewritten")
		return d
	}

	// Of the 50 buckets, an endpoint change moves about log2 50; an
	// assignment in the order of the addresses would move every bucket
	// from the eleventh to the last here.
	const few = 7
	replaced := slices.Clone(svc.Endpoints)
	replaced[10].Addr = netip.MustParseAddr("10.244.2.1")
	require.NoError(t, b.Upsert(servicelb.Service{Name: svc.Name, ClusterIPs: svc.ClusterIPs, Ports: svc.Ports, Endpoints: replaced}))
	next := b.State()
	d := change(next)
	assert.Empty(t, append(d.addSets, d.delSets...), "sets added or deleted")
	hairpin := fixedSet(kindHairpin, servicelb.IPv4)
	assert.ElementsMatch(t, []setID{endpoints, hairpin}, slices.Collect(maps.Keys(d.delElems)), "sets elements left")
	assert.NotEmpty(t, d.delElems[endpoints], "elements deleted from the endpoints map")
	assert.LessOrEqual(t, len(d.delElems[endpoints]), few, "elements deleted from the endpoints map")
	assert.Len(t, d.addElems[endpoints], len(d.delElems[endpoints]), "elements added to the endpoints map")
	ch := servicelb.Diff(a, next)
	allocs := testing.AllocsPerRun(20, func() {
		s, _ := p.plan(m, &ch, next)
		s.delta(m)
	})
	assert.Less(t, allocs, 400.0, "allocations of planning a one-endpoint change")

	added := append(slices.Clone(svc.Endpoints), eps("", "10.244.9.9")...)
	require.NoError(t, b.Upsert(servicelb.Service{Name: svc.Name, ClusterIPs: svc.ClusterIPs, Ports: svc.Ports, Endpoints: added}))
	d = change(b.State(), "cluster4")
	from, to := bucketSet(servicelb.IPv4, false, 50), bucketSet(servicelb.IPv4, false, 51)
	assert.Equal(t, []setID{from}, d.delSets, "the last port of 50 buckets goes")
	assert.Equal(t, []setID{to}, d.addSets, "the first port of 51 buckets comes")
	assert.Len(t, d.delElems[from], 1)
	assert.Len(t, d.addElems[to], 1)
	assert.Len(t, d.addElems[endpoints], len(d.delElems[endpoints])+1, "elements added to the endpoints map")
	assert.LessOrEqual(t, len(d.addElems[endpoints]), few, "elements added to the endpoints map")
}

func chainNamesOf(cs []chainPlan) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.name)
	}
	return out
}

// TestForRendering: a Proxier for rendering renders what Render does, and
// refuses to sync or clean up, having no socket; closing it is harmless.
func TestForRendering(t *testing.T) {
	st, err := servicelb.NewState(servicelb.NodeConfig{}, servicelb.Service{
		Name: "ns/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}},
		Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.244.1.2")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := ForRendering(Options{Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Render(st)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Render(st, Options{Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("render (-want +got):\n%s", diff)
	}
	if err := servicetest.SyncErr(p.Sync(t.Context(), st)); !errors.Is(err, ErrRenderOnly) {
		t.Errorf("Sync: %v, want ErrRenderOnly", err)
	}
	if err := p.Cleanup(t.Context()); !errors.Is(err, ErrRenderOnly) {
		t.Errorf("Cleanup: %v, want ErrRenderOnly", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := ForRendering(Options{Table: "not a name"}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("ForRendering with a bad table name: %v", err)
	}
}
