//go:build linux

package ipvs

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestMirrorFollowsTheKernel applies random requests the kernel took to a
// mirror, then reads the same kernel into a fresh one, and requires after
// every step what the Proxier relies on: the virtual servers are those
// the requests left, each address is used by as many of them as name it,
// every draining real server is at weight 0 in its server and has drained
// since the request that quiesced it, and a new read of the kernel keeps
// the drains with their start.
func TestMirrorFollowsTheKernel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	m := newMirror()
	m.read(nil)
	kernel := map[vsKey]*VirtualServer{}
	began := map[realKey]time.Time{}
	vss := func(i int) *VirtualServer {
		vs := &VirtualServer{Addr: netip.AddrFrom4([4]byte{10, 96, 0, byte(i % 3)}), Protocol: servicelb.TCP, Port: uint16(80 + i), Family: servicelb.IPv4}
		if i == 5 {
			vs = &VirtualServer{FWMark: 0x4000, Family: servicelb.IPv4}
		}
		return vs
	}
	for step := range 2000 {
		now := t0.Add(time.Duration(step) * time.Second)
		vs := vss(rng.IntN(6))
		k := vs.key()
		have := kernel[k]
		r := RealServer{Addr: netip.AddrFrom4([4]byte{10, 244, 0, byte(rng.IntN(4))}), Port: 8080, Weight: 1}
		var o ipvsOp
		switch {
		case have == nil:
			o = ipvsOp{kind: newService, vs: vs}
		case rng.IntN(10) == 0:
			o = ipvsOp{kind: delService, vs: have}
		case rng.IntN(10) == 0:
			v := *vs
			v.Scheduler = "wrr"
			o = ipvsOp{kind: updateService, vs: &v}
		default:
			i := have.realIndex(r.AddrPort())
			switch {
			case i < 0:
				o = ipvsOp{kind: newReal, vs: have, r: r}
			case rng.IntN(3) == 0:
				o = ipvsOp{kind: delReal, vs: have, r: r}
			case rng.IntN(2) == 0:
				r.Weight = 0
				o = ipvsOp{kind: quiesceReal, vs: have, r: r}
			default:
				r.Weight = uint16(1 + rng.IntN(3))
				o = ipvsOp{kind: updateReal, vs: have, r: r}
			}
		}
		// The kernel, as the request leaves it.
		rk := realKey{k, r.AddrPort()}
		switch o.kind {
		case newService:
			kernel[k] = &VirtualServer{Addr: vs.Addr, Protocol: vs.Protocol, Port: vs.Port, FWMark: vs.FWMark, Family: vs.Family}
		case updateService:
			kernel[k].Scheduler = o.vs.Scheduler
		case delService:
			delete(kernel, k)
			for d := range began {
				if d.vs == k {
					delete(began, d)
				}
			}
		case newReal, updateReal, quiesceReal:
			if i := have.realIndex(r.AddrPort()); i >= 0 {
				have.Real[i].Weight = r.Weight
			} else {
				i, _ := slices.BinarySearchFunc(have.Real, r, compareReal)
				have.Real = slices.Insert(have.Real, i, r)
			}
			if _, ok := began[rk]; o.kind == quiesceReal && !ok {
				began[rk] = now
			} else if o.kind != quiesceReal {
				delete(began, rk)
			}
		case delReal:
			have.Real = slices.DeleteFunc(have.Real, func(x RealServer) bool { return x.AddrPort() == r.AddrPort() })
			delete(began, rk)
		}
		m.record(o, now)
		checkMirror(t, fmt.Sprintf("step %d (op %d)", step, o.kind), &m, kernel, began)

		if step%97 == 0 {
			// A new read of the kernel: the same servers, adopted.
			var prefixes []netip.Prefix
			for a := range m.present {
				prefixes = append(prefixes, netip.PrefixFrom(a, 32))
			}
			m.read(prefixes)
			for _, vs := range kernel {
				c := vs.clone()
				m.adopt(c, now.Add(time.Hour))
			}
			m.dropStaleDrains()
			checkMirror(t, fmt.Sprintf("step %d, read again", step), &m, kernel, began)
		}
	}
}

func checkMirror(t *testing.T, what string, m *mirror, kernel map[vsKey]*VirtualServer, began map[realKey]time.Time) {
	t.Helper()
	require.Equal(t, len(kernel), len(m.servers), what)
	use := map[netip.Addr]int{}
	for k, vs := range kernel {
		require.NotNil(t, m.servers[k], "%s: %s", what, k)
		require.Equal(t, vs.Real, m.servers[k].Real, "%s: %s", what, k)
		require.Equal(t, vs.Scheduler, m.servers[k].Scheduler, "%s: %s", what, k)
		if k.fwmark == 0 {
			use[k.addr]++
		}
	}
	for a, n := range m.use {
		require.Equal(t, use[a], n, "%s: use of %s", what, a)
	}
	require.Equal(t, began, m.draining, what)
	for rk := range m.draining {
		vs := m.servers[rk.vs]
		require.NotNil(t, vs, "%s: a drain of %s without its server", what, rk.vs)
		require.Equal(t, uint16(0), vs.Real[vs.realIndex(rk.ap)].Weight, "%s: %s drains", what, rk.ap)
	}
}
