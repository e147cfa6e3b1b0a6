package servicelb_test

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// FuzzDiff walks random states and checks Diff between two of them: the
// ports of the first, patched with the changes, are exactly those of the
// second; a state differs from itself in nothing; no two service ports
// share a frontend (clashes are settled before any backend sees them); and
// the stale-flow filters name frontends of the states with sorted serving
// endpoints of their family.
func FuzzDiff(f *testing.F) {
	for _, seed := range []string{"", "a", "kproxy", "\xff\x00\x10\x80", "services and their endpoints"} {
		f.Add([]byte(seed), uint8(30), uint8(3), uint8(17))
	}
	f.Fuzz(func(t *testing.T, data []byte, n, i, j uint8) {
		g := servicetest.New(servicetest.Options{Source: servicetest.Source(data), Schedulers: servicelb.Schedulers()[1:]})
		states, err := g.Walk(int(n%60) + 2)
		if err != nil {
			t.Fatal(err)
		}
		a, b := states[int(i)%len(states)], states[int(j)%len(states)]
		if c := servicelb.Diff(a, a); !c.Empty() {
			t.Fatalf("a state differs from itself: %+v", c)
		}
		c := servicelb.Diff(a, b)
		got := map[servicelb.ServicePortKey]*servicelb.ServicePort{}
		for _, sp := range a.Ports() {
			got[sp.Key] = sp
		}
		for _, sp := range c.Removed {
			delete(got, sp.Key)
		}
		for _, sp := range c.Added {
			got[sp.Key] = sp
		}
		for _, ch := range c.Changed {
			got[ch.New.Key] = ch.New
		}
		want := map[servicelb.ServicePortKey]*servicelb.ServicePort{}
		for _, sp := range b.Ports() {
			want[sp.Key] = sp
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("the first state patched with Diff is not the second")
		}
		checkFrontends(t, b)
		for _, s := range c.StaleFlows() {
			for _, e := range s.Serving {
				if e.Addr().Is4() != s.Dst.Is4() {
					t.Fatalf("stale-flow filter %+v mixes families", s)
				}
			}
		}
	})
}

func checkFrontends(t *testing.T, st *servicelb.State) {
	t.Helper()
	type key struct {
		proto servicelb.Protocol
		ap    netip.AddrPort
	}
	seen := map[key]servicelb.ServicePortKey{}
	for _, sp := range st.Ports() {
		for _, f := range sp.Frontends() {
			k := key{sp.Port.Protocol, f.AddrPort()}
			if o, ok := seen[k]; ok {
				t.Fatalf("%s and %s share %s/%s", o, sp.Key, f.AddrPort(), sp.Port.Protocol)
			}
			seen[k] = sp.Key
		}
	}
}
