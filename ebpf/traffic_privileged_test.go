//go:build privileged || vm

package ebpf_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	kebpf "github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/ebpf/ebpftest"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// world is a topology (the node, three endpoint hosts and a pod host),
// a cgroup with an asker in it, and a socket-level Proxier alone (no
// packet path): the node has no route to any service address, so an ask
// that the hooks do not translate fails.
type world struct {
	env *ebpftest.Env
	tp  *netnstest.Topology
	cg  *netnstest.Cgroup
	p   *kebpf.Proxier
}

const podHost = 3

func newWorld(t *testing.T) *world {
	t.Helper()
	e := newEnv(t)
	tp := netnstest.New(t, netnstest.Options{Backends: 4})
	for _, h := range tp.Backends {
		h.Serve(t, "tcp", 8080)
		h.Serve(t, "udp", 8080)
	}
	w := &world{env: e, tp: tp, cg: netnstest.StartCgroup(t, e.Cgroup)}
	w.p = newSocketLB(t, e, tp.Node.NS, false)
	t.Cleanup(func() {
		if err := w.p.Cleanup(context.Background()); !errors.Is(err, servicelb.ErrClosed) {
			assert.NoError(t, err)
		}
		assert.NoError(t, w.p.Close())
	})
	return w
}

var (
	vip4 = netip.MustParseAddr("10.96.0.10")
	vip6 = netip.MustParseAddr("fd00:96::10")
	ext4 = netip.MustParseAddr("172.16.0.10")
	lb4  = netip.MustParseAddr("172.17.0.10")
)

func node() servicelb.NodeConfig {
	return servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{netnstest.NodeIPv4(), netnstest.NodeIPv6()},
		ClusterCIDRs: netnstest.ClusterCIDRs()}
}

// eps returns ready endpoints on the hosts given, on node n, both
// families.
func eps(n string, hosts ...int) []servicelb.Endpoint {
	var out []servicelb.Endpoint
	for _, h := range hosts {
		for _, a := range []netip.Addr{netnstest.BackendIPv4(h), netnstest.BackendIPv6(h)} {
			out = append(out, servicelb.Endpoint{Addr: a, NodeName: n})
		}
	}
	return out
}

func service(endpoints []servicelb.Endpoint, opts ...func(*servicelb.Service)) servicelb.Service {
	s := servicelb.Service{Name: "default/web", ClusterIPs: []netip.Addr{vip4, vip6},
		Ports: []servicelb.Port{
			{Name: "tcp", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080},
			{Name: "udp", Protocol: servicelb.UDP, Port: 80, TargetPort: 8080},
		}, Endpoints: endpoints}
	for _, o := range opts {
		o(&s)
	}
	return s
}

func (w *world) sync(t *testing.T, n servicelb.NodeConfig, svcs ...servicelb.Service) *servicelb.State {
	t.Helper()
	st, err := servicelb.NewState(n, svcs...)
	require.NoError(t, err)
	require.NoError(t, servicetest.SyncErr(w.p.Sync(context.Background(), st)))
	return st
}

func (w *world) ask(from *netnstest.Host, proto string, dst netip.AddrPort, opts ...netnstest.AskOption) (netnstest.Reply, error) {
	opts = append([]netnstest.AskOption{netnstest.InCgroup(w.cg), netnstest.Timeout(2 * time.Second)}, opts...)
	return from.Ask(context.Background(), proto, dst, opts...)
}

// TestSocketsReachEndpoints: the node's sockets and a pod's in the cgroup
// reach the endpoints of cluster, external and load-balancer IPs and node
// ports over TCP and UDP, connected or not, with getpeername and recvfrom
// showing the service's address; the endpoint sees the pod's own address
// and the node's address on its link. A socket outside the cgroup is not
// translated.
func TestSocketsReachEndpoints(t *testing.T) {
	w := newWorld(t)
	w.sync(t, node(), service(eps("elsewhere", 0, 1, 2), func(s *servicelb.Service) {
		s.ExternalIPs, s.LoadBalancerIPs = []netip.Addr{ext4}, []netip.Addr{lb4}
		s.Ports[0].NodePort, s.Ports[1].NodePort = 30080, 30080
	}))
	frontends := []netip.AddrPort{netip.AddrPortFrom(vip4, 80), netip.AddrPortFrom(vip6, 80), netip.AddrPortFrom(ext4, 80),
		netip.AddrPortFrom(lb4, 80), netip.AddrPortFrom(netnstest.NodeIPv4(), 30080), netip.AddrPortFrom(netnstest.NodeIPv6(), 30080)}
	asks := []struct {
		proto string
		opts  []netnstest.AskOption
	}{{"tcp", nil}, {"udp", nil}, {"udp", []netnstest.AskOption{netnstest.Unconnected()}}}
	for _, dst := range frontends {
		for _, a := range asks {
			what := fmt.Sprintf("node %s %s %v", a.proto, dst, a.opts != nil)
			var peer netip.AddrPort
			r, err := w.ask(w.tp.Node, a.proto, dst, append(a.opts, netnstest.Peer(&peer))...)
			require.NoError(t, err, what)
			i := hostIndex(r.Host)
			require.Contains(t, []int{0, 1, 2}, i, what)
			gw := w.tp.Backends[i].Gateway4
			if dst.Addr().Is6() {
				gw = w.tp.Backends[i].Gateway6
			}
			assert.Equal(t, gw, r.Client.Addr(), "%s: the node's address on the endpoint's link", what)
			assert.Equal(t, dst, peer, "%s: the peer the socket sees", what)
		}
	}
	pod := w.tp.Backends[podHost]
	for _, dst := range frontends[:2] {
		for _, a := range asks {
			var peer netip.AddrPort
			r, err := w.ask(pod, a.proto, dst, append(a.opts, netnstest.Peer(&peer))...)
			require.NoError(t, err)
			own := pod.IPv4
			if dst.Addr().Is6() {
				own = pod.IPv6
			}
			assert.Equal(t, own, r.Client.Addr(), "pod %s %s: its own address", a.proto, dst)
			assert.Equal(t, dst, peer)
		}
	}
	_, err := w.tp.Node.Ask(context.Background(), "tcp", frontends[0])
	assert.ErrorIs(t, err, syscall.ENETUNREACH, "a socket outside the cgroup is not translated")
}

func hostIndex(name string) int {
	var i int
	if _, err := fmt.Sscanf(name, "backend-%d", &i); err != nil {
		return -1
	}
	return i
}

// TestSpreadFollowsWeights: new connections spread evenly, and in
// proportion to weights, within bounds a correct random spread leaves with
// probability below 1e-6; a drained endpoint takes none.
func TestSpreadFollowsWeights(t *testing.T) {
	w := newWorld(t)
	dst := netip.AddrPortFrom(vip4, 80)
	for _, tc := range []struct {
		name    string
		weights []uint16
	}{{"even", []uint16{1, 1, 1}}, {"weighted", []uint16{1, 2, 3}}, {"drained", []uint16{0, 1, 1}}} {
		t.Run(tc.name, func(t *testing.T) {
			var list []servicelb.Endpoint
			shares := map[string]float64{}
			for i, wt := range tc.weights {
				e := eps("elsewhere", i)
				for j := range e {
					e[j].Weight = servicelb.Weight(wt)
				}
				list = append(list, e...)
				if wt > 0 {
					shares[fmt.Sprintf("backend-%d", i)] = float64(wt)
				}
			}
			w.sync(t, node(), service(list))
			n := 600
			counts := w.tp.Node.Count(t, "tcp", dst, n, netnstest.InCgroup(w.cg))
			require.NoError(t, netnstest.WithinBounds(counts, netnstest.WeightedShares(shares), n))
		})
	}
}

// TestRejectAndDrop: a port without endpoints fails connect and send with
// ECONNREFUSED at once; one whose Local policy leaves it no endpoint on
// this node fails them with EPERM, as a drop on the way out does.
func TestRejectAndDrop(t *testing.T) {
	w := newWorld(t)
	dst := netip.AddrPortFrom(vip4, 80)
	check := func(want syscall.Errno) {
		t.Helper()
		for _, a := range []struct {
			proto string
			opts  []netnstest.AskOption
		}{{"tcp", nil}, {"udp", nil}, {"udp", []netnstest.AskOption{netnstest.Unconnected()}}} {
			for _, h := range []*netnstest.Host{w.tp.Node, w.tp.Backends[podHost]} {
				_, err := w.ask(h, a.proto, dst, a.opts...)
				var ae *netnstest.AskError
				require.ErrorAs(t, err, &ae)
				assert.True(t, ae.AtSocket, "%s %s: %v", h.Name, a.proto, err)
				assert.ErrorIs(t, err, want, "%s %s", h.Name, a.proto)
			}
		}
	}
	w.sync(t, node(), service(nil))
	check(syscall.ECONNREFUSED)
	w.sync(t, node(), service(eps("elsewhere", 0), func(s *servicelb.Service) { s.InternalTrafficPolicy = servicelb.PolicyLocal }))
	check(syscall.EPERM)
}

// TestLocalPolicy: the internal Local policy takes the node's own
// endpoints only.
func TestLocalPolicy(t *testing.T) {
	w := newWorld(t)
	list := append(eps("node", 0), eps("elsewhere", 1, 2)...)
	w.sync(t, node(), service(list, func(s *servicelb.Service) { s.InternalTrafficPolicy = servicelb.PolicyLocal }))
	counts := w.tp.Backends[podHost].Count(t, "tcp", netip.AddrPortFrom(vip4, 80), 40, netnstest.InCgroup(w.cg))
	assert.Equal(t, map[string]int{"backend-0": 40}, counts)
}

// TestAffinityPinsAndExpires: with ClientIP affinity a client (its
// network namespace) stays with the endpoint it reached while its flows
// come less than the timeout apart, even when the weights now favour
// another endpoint 4095 to 1; once the timeout passed, it is pinned anew,
// by the weights.
func TestAffinityPinsAndExpires(t *testing.T) {
	w := newWorld(t)
	dst := netip.AddrPortFrom(vip4, 80)
	sticky := func(s *servicelb.Service) {
		s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: 2 * time.Second}
	}
	w.sync(t, node(), service(eps("elsewhere", 0), sticky))
	r, err := w.ask(w.tp.Node, "tcp", dst)
	require.NoError(t, err)
	require.Equal(t, "backend-0", r.Host)
	favour1 := append(eps("elsewhere", 0), eps("elsewhere", 1)...)
	for i := range favour1[2:] {
		favour1[2+i].Weight = servicelb.Weight(65535)
	}
	w.sync(t, node(), service(favour1, sticky))
	for range 5 {
		assert.Equal(t, map[string]int{"backend-0": 4}, w.tp.Node.Count(t, "tcp", dst, 4, netnstest.InCgroup(w.cg)), "pinned")
		time.Sleep(500 * time.Millisecond)
	}
	counts := w.tp.Backends[podHost].Count(t, "tcp", dst, 4, netnstest.InCgroup(w.cg))
	assert.Equal(t, map[string]int{"backend-1": 4}, counts, "another client is pinned by the weights")
	time.Sleep(2500 * time.Millisecond)
	assert.Equal(t, map[string]int{"backend-1": 4}, w.tp.Node.Count(t, "tcp", dst, 4, netnstest.InCgroup(w.cg)), "pinned anew after the timeout")

	// Dump lists the pins, the node's and the pod's, and the sockets'
	// reverse translations, each with its service port (the TCP and the
	// UDP one of the address: a translation does not say which).
	dump, err := w.p.Dump(context.Background())
	require.NoError(t, err)
	be1 := regexp.QuoteMeta(netnstest.BackendIPv4(1).String())
	assert.Regexp(t, `(?m)^  netns \d+ \(node\) set \d+ -> `+be1+`:8080 idle \S+  # default/web:tcp/ipv4 cluster$`, dump)
	assert.Regexp(t, `(?m)^  netns \d+ set \d+ -> `+be1+`:8080 idle \S+  # default/web:tcp/ipv4 cluster$`, dump)
	assert.Regexp(t, `(?m)^  socket \d+ `+be1+`:8080 shows 10\.96\.0\.10:80  # default/web:tcp/ipv4 cluster IP \| default/web:udp/ipv4 cluster IP$`, dump)
}

// TestRestartAdoptsWithoutAGap: a Proxier closed without Cleanup leaves
// its hooks attached and its maps pinned, so sockets are balanced with no
// process holding them; a new Proxier adopts the same links and sets,
// writes nothing for an unchanged state, and balances what changes next.
func TestRestartAdoptsWithoutAGap(t *testing.T) {
	w := newWorld(t)
	dst := netip.AddrPortFrom(vip4, 80)
	w.sync(t, node(), service(eps("elsewhere", 0, 1)))
	before, err := w.p.Dump(context.Background())
	require.NoError(t, err)
	links := linkIDs(t, w.env)
	require.NoError(t, w.p.Close())
	counts := w.tp.Node.Count(t, "tcp", dst, 20, netnstest.InCgroup(w.cg))
	assert.Equal(t, 20, counts["backend-0"]+counts["backend-1"], "balanced while no process holds the hooks: %v", counts)

	w.p = newSocketLB(t, w.env, w.tp.Node.NS, false)
	w.sync(t, node(), service(eps("elsewhere", 0, 1)))
	after, err := w.p.Dump(context.Background())
	require.NoError(t, err)
	assert.Equal(t, ownMaps(before), ownMaps(after), "the adopted maps are as they were")
	assert.Equal(t, links, linkIDs(t, w.env), "the same links, their programs replaced in place")
	w.sync(t, node(), service(eps("elsewhere", 2)))
	assert.Equal(t, map[string]int{"backend-2": 10}, w.tp.Node.Count(t, "tcp", dst, 10, netnstest.InCgroup(w.cg)))
}

// ownMaps cuts from a Dump what the hooks write themselves, which the
// sockets' flows change.
func ownMaps(dump string) string {
	own, _, _ := strings.Cut(dump, "map kp_affinity:")
	return own
}

// linkIDs returns the ids of the pinned links.
func linkIDs(t *testing.T, e *ebpftest.Env) map[string]link.ID {
	t.Helper()
	out := map[string]link.ID{}
	paths, err := filepath.Glob(filepath.Join(e.BPFFS, "kproxy", "link_*"))
	require.NoError(t, err)
	require.Len(t, paths, 8)
	for _, p := range paths {
		l, err := link.LoadPinnedLink(p, nil)
		require.NoError(t, err)
		info, err := l.Info()
		require.NoError(t, err)
		out[filepath.Base(p)] = info.ID
		l.Close()
	}
	return out
}

// TestCleanupLeavesNothing: Cleanup detaches every hook (the cgroup
// holds no program), removes every pin and the pin directory; Close then
// frees the maps. The root cgroup never meets a hook.
func TestCleanupLeavesNothing(t *testing.T) {
	w := newWorld(t)
	rootBefore := attachedPrograms(t, w.env.Root)
	w.sync(t, node(), service(eps("elsewhere", 0)))
	var mapIDs []ebpf.MapID
	for _, name := range []string{"kp_frontends", "kp_sets", "kp_slots", "kp_revnat"} {
		m, err := ebpf.LoadPinnedMap(mapPin(t, filepath.Join(w.env.BPFFS, "kproxy"), name), nil)
		require.NoError(t, err)
		info, err := m.Info()
		require.NoError(t, err)
		id, _ := info.ID()
		mapIDs = append(mapIDs, id)
		m.Close()
	}
	ours := attachedPrograms(t, w.env.Cgroup)
	require.Len(t, ours, 8)
	// The root of the hierarchy (the host's root cgroup, through the
	// private mount) never holds the Proxier's programs: its list is
	// what it was before the test (nothing, where nothing else attaches
	// there).
	assert.Equal(t, rootBefore, attachedPrograms(t, w.env.Root), "the root cgroup's hooks")
	require.NoError(t, w.p.Cleanup(context.Background()))
	assert.Empty(t, attachedPrograms(t, w.env.Cgroup))
	assert.Equal(t, rootBefore, attachedPrograms(t, w.env.Root), "the root cgroup's hooks")
	assert.NoDirExists(t, filepath.Join(w.env.BPFFS, "kproxy"))
	_, err := w.ask(w.tp.Node, "tcp", netip.AddrPortFrom(vip4, 80))
	assert.ErrorIs(t, err, syscall.ENETUNREACH, "no longer translated")
	require.NoError(t, w.p.Close())
	// The kernel frees programs, and then their maps, in deferred work.
	for _, id := range mapIDs {
		assert.Eventually(t, func() bool {
			m, err := ebpf.NewMapFromID(id)
			if err == nil {
				m.Close()
			}
			return errors.Is(err, os.ErrNotExist)
		}, 10*time.Second, 10*time.Millisecond, "map %d outlived Close", id)
	}
}

// attachedPrograms lists the programs attached to a cgroup at the hooks
// the Proxier uses.
func attachedPrograms(t *testing.T, cgroup string) []ebpf.ProgramID {
	t.Helper()
	ids, err := kebpf.Attached(cgroup)
	require.NoError(t, err)
	return ids
}

// TestRepairs: a hook someone detached, a pin someone removed and a map
// entry someone deleted are put back by the next sync.
func TestRepairs(t *testing.T) {
	w := newWorld(t)
	dst := netip.AddrPortFrom(vip4, 80)
	st := w.sync(t, node(), service(eps("elsewhere", 0)))
	pin := filepath.Join(w.env.BPFFS, "kproxy", "link_connect4")
	l, err := link.LoadPinnedLink(pin, nil)
	require.NoError(t, err)
	require.NoError(t, l.Unpin())
	require.NoError(t, l.Detach())
	l.Close()
	_, err = w.ask(w.tp.Node, "tcp", dst)
	require.Error(t, err, "detached")
	require.NoError(t, servicetest.SyncErr(w.p.Sync(context.Background(), st)))
	_, err = w.ask(w.tp.Node, "tcp", dst)
	require.NoError(t, err, "attached again")
	assert.FileExists(t, pin)

	m, err := ebpf.LoadPinnedMap(mapPin(t, filepath.Join(w.env.BPFFS, "kproxy"), "kp_frontends"), nil)
	require.NoError(t, err)
	defer m.Close()
	var k [20]byte
	it := m.Iterate()
	var v [12]byte
	require.True(t, it.Next(&k, &v))
	require.NoError(t, m.Delete(k))
	require.NoError(t, servicetest.SyncErr(w.p.Sync(context.Background(), st)), "an unchanged state verifies the maps in depth")
	require.NoError(t, m.Lookup(k, &v), "the entry is back")
}

// TestProbeNamesWhatIsMissing: a cgroup directory that is not cgroup v2,
// and a pin path not on a bpf filesystem, are refused before anything is
// loaded or attached, each with a FeatureError naming it.
func TestProbeNamesWhatIsMissing(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		o       kebpf.Options
		feature string
	}{
		{kebpf.Options{Cgroup: t.TempDir()}, "cgroup v2"},
		{kebpf.Options{Cgroup: e.Cgroup, PinPath: filepath.Join(t.TempDir(), "pins")}, "bpffs"},
	} {
		_, err := kebpf.New(tc.o)
		var fe *kebpf.FeatureError
		require.ErrorAs(t, err, &fe)
		assert.Equal(t, tc.feature, fe.Feature)
		assert.ErrorIs(t, err, kebpf.ErrNotSupported)
	}
	assert.Empty(t, attachedPrograms(t, e.Cgroup))
	require.NoError(t, kebpf.Probe(kebpf.Options{Cgroup: e.Cgroup, PinPath: e.BPFFS}))
	assert.False(t, errors.Is(kebpf.Probe(kebpf.Options{Cgroup: e.Cgroup}), kebpf.ErrNotSupported))
}

// TestCleanupTouchesNothingElse: two Proxiers on one cgroup, with pin
// directories of their own (one holding a file that is not a pin):
// cleaning one up leaves the other's hooks and pins, and the foreign file
// with its directory; the other still balances.
func TestCleanupTouchesNothingElse(t *testing.T) {
	w := newWorld(t)
	w.sync(t, node(), service(eps("elsewhere", 0)))
	foreign := filepath.Join(w.env.BPFFS, "kproxy", "someone-elses")
	require.NoError(t, os.Mkdir(foreign, 0o700))
	other, err := kebpf.New(kebpf.Options{Cgroup: w.env.Cgroup, PinPath: filepath.Join(w.env.BPFFS, "other"), NetNS: w.tp.Node.NS})
	require.NoError(t, err)
	defer other.Close()
	st, err := servicelb.NewState(node(), service(eps("elsewhere", 1), func(s *servicelb.Service) {
		s.Name, s.ClusterIPs = "default/other", []netip.Addr{netip.MustParseAddr("10.96.0.20")}
	}))
	require.NoError(t, err)
	require.NoError(t, servicetest.SyncErr(other.Sync(context.Background(), st)))
	require.Len(t, attachedPrograms(t, w.env.Cgroup), 16)

	require.NoError(t, w.p.Cleanup(context.Background()))
	assert.Len(t, attachedPrograms(t, w.env.Cgroup), 8, "the other Proxier's hooks stay")
	assert.DirExists(t, foreign)
	pins, err := filepath.Glob(filepath.Join(w.env.BPFFS, "other", "link_*"))
	require.NoError(t, err)
	maps, err := filepath.Glob(filepath.Join(w.env.BPFFS, "other", "maps-*", "kp_*"))
	require.NoError(t, err)
	assert.Len(t, append(pins, maps...), 17, "the other Proxier's pins stay")
	r, err := w.ask(w.tp.Node, "tcp", netip.MustParseAddrPort("10.96.0.20:80"))
	require.NoError(t, err)
	assert.Equal(t, "backend-1", r.Host)
	require.NoError(t, other.Cleanup(context.Background()))
	assert.Empty(t, attachedPrograms(t, w.env.Cgroup))
	require.NoError(t, os.Remove(foreign))
}

// TestRemovePins: after a Proxier closed with its hooks and maps pinned,
// RemovePins, which needs no Proxier, detaches every hook and removes
// every pin; a file that is not a pin keeps its directory; a missing
// directory is nothing to remove.
func TestRemovePins(t *testing.T) {
	w := newWorld(t)
	dst := netip.AddrPortFrom(vip4, 80)
	w.sync(t, node(), service(eps("elsewhere", 0)))
	require.NoError(t, w.p.Close())
	_, err := w.ask(w.tp.Node, "tcp", dst)
	require.NoError(t, err, "the pinned hooks balance after Close")
	dir := filepath.Join(w.env.BPFFS, "kproxy")
	foreign := filepath.Join(dir, "someone-elses")
	require.NoError(t, os.Mkdir(foreign, 0o700))

	require.NoError(t, kebpf.RemovePins(dir))
	// The kernel releases a link whose last reference went in deferred
	// work.
	assert.Eventually(t, func() bool { return len(attachedPrograms(t, w.env.Cgroup)) == 0 }, 10*time.Second, 10*time.Millisecond)
	left, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	assert.Equal(t, []string{foreign}, left)
	_, err = w.ask(w.tp.Node, "tcp", dst)
	assert.ErrorIs(t, err, syscall.ENETUNREACH, "no longer translated")

	require.NoError(t, os.Remove(foreign))
	require.NoError(t, kebpf.RemovePins(dir))
	assert.NoDirExists(t, dir, "an empty directory is removed")
	assert.NoError(t, kebpf.RemovePins(dir))
	assert.NoError(t, kebpf.RemovePins(""))
}

// TestUpgradeToAnotherLayout: a Proxier of another map layout (other
// Sizes here, another version alike) over the pins of an earlier one
// (kept as a version before named layouts pinned them, in PinPath
// itself) starts, writes maps of its own beside them and swaps its
// programs into the pinned links, while the node asks the service all
// along: no ask fails. Then the earlier maps' pins are gone, and a map
// of its own layout it cannot read is a *PinError naming the way out.
func TestUpgradeToAnotherLayout(t *testing.T) {
	w := newWorld(t)
	dst := netip.AddrPortFrom(vip4, 80)
	require.NoError(t, w.p.Cleanup(context.Background()))
	require.NoError(t, w.p.Close())
	pins := filepath.Join(w.env.BPFFS, "layout")
	o := kebpf.Options{Cgroup: w.env.Cgroup, PinPath: pins, NetNS: w.tp.Node.NS, Sizes: kebpf.Sizes{Frontends: 1 << 10}}
	old, err := kebpf.New(o)
	require.NoError(t, err)
	st, err := servicelb.NewState(node(), service(eps("elsewhere", 0)))
	require.NoError(t, err)
	require.NoError(t, servicetest.SyncErr(old.Sync(context.Background(), st)))
	require.NoError(t, old.Close())
	// The earlier version's place for its maps: PinPath itself.
	dirs, err := filepath.Glob(filepath.Join(pins, "maps-*"))
	require.NoError(t, err)
	require.Len(t, dirs, 1)
	files, err := filepath.Glob(filepath.Join(dirs[0], "kp_*"))
	require.NoError(t, err)
	require.Len(t, files, 9)
	for _, f := range files {
		require.NoError(t, os.Rename(f, filepath.Join(pins, filepath.Base(f))))
	}
	require.NoError(t, os.Remove(dirs[0]))

	stop := make(chan struct{})
	var asked, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			asked.Add(1)
			if r, err := w.ask(w.tp.Node, "tcp", dst); err != nil || r.Host != "backend-0" {
				failed.Add(1)
				t.Logf("ask during the upgrade: %+v, %v", r, err)
			}
		}
	})
	for asked.Load() < 5 {
		time.Sleep(5 * time.Millisecond)
	}
	o.Sizes = kebpf.Sizes{}
	w.p, err = kebpf.New(o)
	require.NoError(t, err, "pins of another layout are no obstacle")
	require.NoError(t, servicetest.SyncErr(w.p.Sync(context.Background(), st)))
	n := asked.Load()
	for asked.Load() < n+5 {
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	assert.Zero(t, failed.Load(), "asks failed during the upgrade, of %d", asked.Load())
	t.Logf("%d asks during the upgrade, %d failed", asked.Load(), failed.Load())
	assert.Len(t, attachedPrograms(t, w.env.Cgroup), 8, "the links were updated in place")
	left, err := filepath.Glob(filepath.Join(pins, "kp_*"))
	require.NoError(t, err)
	assert.Empty(t, left, "the earlier maps' pins")
	dirs, err = filepath.Glob(filepath.Join(pins, "maps-*"))
	require.NoError(t, err)
	require.Len(t, dirs, 1, "one layout's maps")

	// A map pinned in the Proxier's own layout that it cannot read.
	require.NoError(t, w.p.Close())
	frontends := filepath.Join(dirs[0], "kp_frontends")
	require.NoError(t, os.Remove(frontends))
	foreign, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	require.NoError(t, err)
	defer foreign.Close()
	require.NoError(t, foreign.Pin(frontends))
	_, err = kebpf.New(o)
	var pe *kebpf.PinError
	require.ErrorAs(t, err, &pe)
	assert.ErrorIs(t, err, kebpf.ErrPinIncompatible)
	assert.Equal(t, frontends, pe.Path)
	assert.Contains(t, err.Error(), "RemovePins")
	r, err := w.ask(w.tp.Node, "tcp", dst)
	require.NoError(t, err, "the pinned hooks still balance")
	assert.Equal(t, "backend-0", r.Host)
	require.NoError(t, kebpf.RemovePins(pe.PinPath))
	_, err = os.Stat(pins)
	if !assert.ErrorIs(t, err, os.ErrNotExist, "RemovePins leaves nothing of its own") {
		filepath.Walk(pins, func(path string, _ os.FileInfo, _ error) error { t.Log(path); return nil })
	}
	w.p, err = kebpf.New(o)
	require.NoError(t, err)
	require.NoError(t, servicetest.SyncErr(w.p.Sync(context.Background(), st)))
	r, err = w.ask(w.tp.Node, "tcp", dst)
	require.NoError(t, err)
	assert.Equal(t, "backend-0", r.Host)
}

// TestUDPFlowsKeepTheirEndpoint: unconnected UDP sockets of the node and
// of a pod each keep sending to the endpoint they first reached while it
// stays in the set, whatever else the set gains or loses, as a conntrack
// flow keeps its translation under kube-proxy; once its endpoint leaves
// the set, a socket's next datagram goes to one that is in it, and stays
// there.
func TestUDPFlowsKeepTheirEndpoint(t *testing.T) {
	w := newWorld(t)
	dst := netip.AddrPortFrom(vip4, 80)
	type flow struct {
		h    *netnstest.Host
		name string
		at   int
	}
	var flows []*flow
	for i := range 8 {
		for _, h := range []*netnstest.Host{w.tp.Node, w.tp.Backends[podHost]} {
			flows = append(flows, &flow{h: h, name: fmt.Sprintf("flow-%d", i), at: -1})
		}
	}
	moved := 0
	for _, set := range [][]int{{0, 1, 2}, {0, 1}, {0, 1, 2}, {1, 2}, {0, 1, 2}} {
		w.sync(t, node(), service(eps("elsewhere", set...)))
		for _, f := range flows {
			r, err := w.ask(f.h, "udp", dst, netnstest.KeepSocket(f.name))
			require.NoError(t, err, "%s of %s to the set %v", f.name, f.h.Name, set)
			i := hostIndex(r.Host)
			require.Contains(t, set, i, "%s of %s", f.name, f.h.Name)
			switch {
			case f.at < 0:
			case slices.Contains(set, f.at):
				assert.Equal(t, f.at, i, "%s of %s left endpoint %d, still in the set %v", f.name, f.h.Name, f.at, set)
			default:
				moved++
			}
			f.at = i
		}
	}
	assert.Positive(t, moved, "no flow's endpoint left the set: the changes tested nothing")
}

// TestConnectedUDPSocketsLeaveADeletedEndpoint: a connected UDP socket of
// the node or of a pod that the hooks sent to an endpoint is connected
// again to its frontend once that endpoint leaves a set others still
// serve, so that its next datagram reaches a serving endpoint with no
// error for its owner, while every socket on a serving endpoint keeps it.
// And once no endpoint serves the frontend, a socket whose endpoint left
// is disconnected: its owner's send fails, never reaching the endpoint.
func TestConnectedUDPSocketsLeaveADeletedEndpoint(t *testing.T) {
	w := newWorld(t)
	type flow struct {
		h    *netnstest.Host
		name string
		dst  netip.AddrPort
		at   int
	}
	var flows []*flow
	w.sync(t, node(), service(eps("elsewhere", 0, 1, 2)))
	for i := range 8 {
		for _, h := range []*netnstest.Host{w.tp.Node, w.tp.Backends[podHost]} {
			for _, vip := range []netip.Addr{vip4, vip6} {
				f := &flow{h: h, name: fmt.Sprintf("flow-%d", i), dst: netip.AddrPortFrom(vip, 80)}
				r, err := w.ask(h, "udp", f.dst, netnstest.KeepConnected(f.name))
				require.NoError(t, err)
				f.at = hostIndex(r.Host)
				flows = append(flows, f)
			}
		}
	}
	w.sync(t, node(), service(eps("elsewhere", 0, 1)))
	moved := 0
	for _, f := range flows {
		what := fmt.Sprintf("%s of %s to %s, on endpoint %d", f.name, f.h.Name, f.dst, f.at)
		r, err := w.ask(f.h, "udp", f.dst, netnstest.KeepConnected(f.name))
		if !assert.NoError(t, err, what) {
			continue
		}
		if f.at != 2 {
			assert.Equal(t, f.at, hostIndex(r.Host), what)
			continue
		}
		assert.Contains(t, []int{0, 1}, hostIndex(r.Host), "%s: answered by the endpoint that left", what)
		moved++
		f.at = hostIndex(r.Host)
	}
	assert.Positive(t, moved, "no socket was on the endpoint removed: the change tested nothing")
}

// TestConnectedUDPSocketsWithNowhereToGo: a connected UDP socket whose
// endpoint left a set that others serve, but none for the socket (the
// internal Local policy, and no endpoint on the node any more), is
// disconnected rather than left on the endpoint: its owner's send fails,
// as kube-proxy's next translation of the flow drops it.
func TestConnectedUDPSocketsWithNowhereToGo(t *testing.T) {
	w := newWorld(t)
	local := func(s *servicelb.Service) { s.InternalTrafficPolicy = servicelb.PolicyLocal }
	w.sync(t, node(), service(append(eps("node", 0), eps("elsewhere", 1)...), local))
	dst := netip.AddrPortFrom(vip4, 80)
	for _, h := range []*netnstest.Host{w.tp.Node, w.tp.Backends[podHost]} {
		r, err := w.ask(h, "udp", dst, netnstest.KeepConnected("flow"))
		require.NoError(t, err)
		require.Equal(t, "backend-0", r.Host, h.Name)
	}
	w.sync(t, node(), service(eps("elsewhere", 1), local))
	for _, h := range []*netnstest.Host{w.tp.Node, w.tp.Backends[podHost]} {
		r, err := w.ask(h, "udp", dst, netnstest.KeepConnected("flow"))
		if assert.Error(t, err, "%s: answered by %s", h.Name, r.Host) {
			assert.True(t, netnstest.SocketEnded(err), "%s: %v, want the socket disconnected", h.Name, err)
		}
	}
}

// beforeSync is a packet path that runs before ahead of each Sync.
type beforeSync struct {
	servicelb.Proxier
	before func()
}

func (b *beforeSync) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	b.before()
	return b.Proxier.Sync(ctx, st)
}

// TestHooksKnowAFrontendBeforeThePacketPath: when a Sync adds a service,
// the hooks balance it before the packet path serves it. A pod's
// connection made as the packet path is about to take the service is the
// hooks' (answered, though the packet path has no rule for it yet), so
// that the packet path never balances a pod's flow, nor pins it under
// session affinity, where the hooks then balance the pod's next flow
// their own way.
func TestHooksKnowAFrontendBeforeThePacketPath(t *testing.T) {
	e := newEnv(t)
	tp := netnstest.New(t, netnstest.Options{Backends: 4})
	for _, h := range tp.Backends {
		h.Serve(t, "tcp", 8080)
	}
	cg := netnstest.StartCgroup(t, e.Cgroup)
	nft, err := nftables.New(nftables.Options{NetNS: tp.Node.NS})
	require.NoError(t, err)
	var asks []error
	other := netip.MustParseAddr("10.96.0.20")
	packets := &beforeSync{Proxier: nft, before: func() {}}
	p, err := kebpf.New(kebpf.Options{Cgroup: e.Cgroup, PinPath: filepath.Join(e.BPFFS, "kproxy"), NetNS: tp.Node.NS, Packets: packets})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, p.Cleanup(context.Background()))
		assert.NoError(t, p.Close())
	})
	web := service(eps("elsewhere", 0))
	st, err := servicelb.NewState(node(), web)
	require.NoError(t, err)
	require.NoError(t, servicetest.SyncErr(p.Sync(t.Context(), st)))

	packets.before = func() {
		_, err := tp.Backends[podHost].Ask(t.Context(), "tcp", netip.AddrPortFrom(other, 80),
			netnstest.InCgroup(cg), netnstest.Timeout(time.Second))
		asks = append(asks, err)
	}
	st, err = servicelb.NewState(node(), web, service(eps("elsewhere", 1), func(s *servicelb.Service) {
		s.Name, s.ClusterIPs = "default/other", []netip.Addr{other}
		s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Minute}
	}))
	require.NoError(t, err)
	require.NoError(t, servicetest.SyncErr(p.Sync(t.Context(), st)))
	require.Len(t, asks, 1)
	assert.NoError(t, asks[0], "a pod's connection as the packet path took the new service")
}
