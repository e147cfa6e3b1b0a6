//go:build linux

package netnstest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/rtnl"
)

// Host is one network namespace of a test: the node, the client, a
// backend, or a lone namespace from NewHost.
type Host struct {
	// Name is the host's role: "node", "client", "backend-0", ... or the
	// name given to NewHost. Echo servers reply with it.
	Name string
	// NSName is the namespace's name under /run/netns (for `ip netns exec`).
	NSName string
	// NS is an open handle to the namespace, valid until the test's
	// cleanup. Pass it to code under test that takes a namespace option.
	NS netns.NsHandle
	// IPv4 and IPv6 are the host's addresses: for the node, its node IPs
	// on the client-facing link; zero for a lone host.
	IPv4, IPv6 netip.Addr
	// Link is the host's interface to the node ("eth0"); empty for the
	// node and for lone hosts.
	Link string
	// NodeLink is the node's end of that link ("ext0" for the client,
	// "veth0", "veth1", ... for the backends, unless Options.Links names
	// it).
	NodeLink string
	// NodeBridge is the bridge NodeLink is a port of, which holds the
	// node's addresses on the link; empty when it is not bridged.
	NodeBridge string
	// Gateway4 and Gateway6 are the node's addresses on the link, the
	// host's default gateways.
	Gateway4, Gateway6 netip.Addr

	node *Host // the topology's node, for routes to added addresses

	mu     sync.Mutex
	closed bool
	kept   map[string]net.PacketConn // KeepSocket's sockets, by network and name
}

// NewHost creates a lone network namespace named after name, with only its
// loopback link up, and removes it when the test ends. It calls Require(t),
// so it skips (or fails under CI=true) without root.
func NewHost(t testing.TB, name string) *Host {
	t.Helper()
	Require(t)
	setup(t)
	h := newHost(t, newToken(), name)
	return h
}

// setup prepares RunDir and reaps the leftovers of crashed runs.
func setup(t testing.TB) {
	t.Helper()
	if err := prepareRunDir(); err != nil {
		t.Fatalf("netnstest: %v", err)
	}
	reaped, err := reap()
	for _, n := range reaped {
		t.Logf("netnstest: removed leftover namespace %s of a process that is gone", n)
	}
	if err != nil {
		t.Logf("netnstest: %v", err)
	}
}

// newHost creates one named namespace, registers its removal and applies
// the defaults every test namespace gets.
func newHost(t testing.TB, token, name string) *Host {
	t.Helper()
	nsName := nsName(token, name)
	ns, err := createNamed(nsName)
	if err != nil {
		t.Fatalf("netnstest: %v", err)
	}
	h := &Host{Name: name, NSName: nsName, NS: ns}
	t.Cleanup(func() {
		if err := h.close(); err != nil {
			t.Errorf("netnstest: %v", err)
		}
	})
	if err := h.Do(defaults); err != nil {
		t.Fatalf("netnstest: configure %s: %v", nsName, err)
	}
	return h
}

func (h *Host) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	h.closeKept()
	h.NS.Close()
	return deleteNamed(h.NSName)
}

// closeKept closes KeepSocket's sockets; h.mu is held.
func (h *Host) closeKept() {
	for _, c := range h.kept {
		c.Close()
	}
	h.kept = nil
}

// sysctl is one setting written in a namespace. Optional settings are
// skipped when the kernel does not have them in a namespace (older kernels
// keep some of them global).
type sysctl struct {
	key, value string
	optional   bool
}

// hostSysctls are the defaults of every namespace: no IPv6 duplicate
// address detection (addresses work at once), no reverse path filter, no
// ICMP rate limits, so that every rejected ask sees its ICMP error, and
// SCTP retransmission timers short enough (where SCTP is loaded) that an
// ask recovers from a lost packet within DefaultTimeout: SCTP's own
// initial timeout of 3 s would turn any loss into a failed ask, and
// emulated machines do lose a packet in a few thousand associations.
func hostSysctls() []sysctl {
	return []sysctl{
		{"net.ipv6.conf.all.accept_dad", "0", false},
		{"net.ipv6.conf.default.accept_dad", "0", false},
		{"net.ipv4.conf.all.rp_filter", "0", false},
		{"net.ipv4.conf.default.rp_filter", "0", false},
		{"net.ipv4.icmp_ratelimit", "0", false},
		{"net.ipv6.icmp.ratelimit", "0", false},
		{"net.ipv4.icmp_msgs_per_sec", "1000000", true},
		{"net.ipv4.icmp_msgs_burst", "1000000", true},
		// rto_min first: rto_initial must not be below it.
		{"net.sctp.rto_min", "50", true},
		{"net.sctp.rto_initial", "200", true},
		{"net.sctp.rto_max", "400", true},
	}
}

// bridgeSysctls keep the packets a bridge of the node carries out of the
// IP hooks at the bridge layer, where the kernel has br_netfilter loaded
// (a test machine may, the VM does not): routed traffic to and from
// bridged hosts then meets the node's rules once, at the IP layer, on
// every machine alike.
func bridgeSysctls() []sysctl {
	return []sysctl{
		{"net.bridge.bridge-nf-call-iptables", "0", true},
		{"net.bridge.bridge-nf-call-ip6tables", "0", true},
		{"net.bridge.bridge-nf-call-arptables", "0", true},
	}
}

// nodeSysctls turn forwarding on in the node.
func nodeSysctls() []sysctl {
	return []sysctl{
		{"net.ipv4.ip_forward", "1", false},
		{"net.ipv6.conf.all.forwarding", "1", false},
	}
}

// writeSysctls writes settings in the namespace of the calling thread.
func writeSysctls(list []sysctl) error {
	for _, s := range list {
		path := "/proc/sys/" + strings.ReplaceAll(s.key, ".", "/")
		err := os.WriteFile(path, []byte(s.value), 0o644)
		if err != nil && !(s.optional && os.IsNotExist(err)) {
			return fmt.Errorf("sysctl %s=%s: %w", s.key, s.value, err)
		}
	}
	return nil
}

// defaults configures a fresh namespace from inside it.
func defaults() error {
	if err := writeSysctls(hostSysctls()); err != nil {
		return err
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// Do runs f on an OS thread switched into the host's namespace and returns
// its error. The calling goroutine's thread never changes namespace: f runs
// on a fresh goroutine locked to its thread, which is moved back afterwards
// (or terminated if that fails). Sockets and netlink handles created in f
// stay in the namespace after f returns; goroutines f starts do not run in
// it. A panic in f is re-raised in the caller; f must not call t.FailNow.
func (h *Host) Do(f func() error) error {
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if closed {
		return fmt.Errorf("host %s: namespace already removed", h.Name)
	}
	if err := inNamespace(h.NS, f); err != nil {
		return err
	}
	return nil
}

// Start starts cmd inside the host's namespace: the child is forked from a
// thread switched into it. The caller waits for cmd as usual.
func (h *Host) Start(cmd *exec.Cmd) error {
	return h.Do(cmd.Start)
}

// Run runs cmd inside the host's namespace and waits for it.
func (h *Host) Run(cmd *exec.Cmd) error {
	if err := h.Start(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// execTimeout bounds every tool Exec runs.
const execTimeout = time.Minute

// Exec runs a tool inside the host's namespace and returns its standard
// output. It fails the test, showing standard error, when the tool fails.
// Call it from the test's goroutine (or a t.Cleanup function: it does not
// depend on the test's context).
func (h *Host) Exec(t testing.TB, name string, args ...string) string {
	t.Helper()
	return h.ExecInput(t, "", name, args...)
}

// ExecInput is Exec with stdin fed to the tool, e.g. an `nft -f -` script.
func (h *Host) ExecInput(t testing.TB, stdin, name string, args ...string) string {
	t.Helper()
	out, err := h.Output(context.Background(), stdin, name, args...)
	if err != nil {
		t.Fatalf("netnstest: %v", err)
	}
	return out
}

// Output runs a tool inside the host's namespace with stdin and returns
// its standard output; the error carries standard error.
func (h *Host) Output(ctx context.Context, stdin, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := h.Run(cmd); err != nil {
		return stdout.String(), fmt.Errorf("%s: %s %s: %w\n%s",
			h.Name, name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// AddAddress adds an address to the host: on its link for the client and
// the backends, on lo for the node and lone hosts. For a client or backend
// address outside its link's subnet, the node gets a route to it through
// the host, so that replies find their way back. Use it to give a client
// several source addresses (see FromAddr).
func (h *Host) AddAddress(t testing.TB, p netip.Prefix) {
	t.Helper()
	if !p.IsValid() {
		t.Fatalf("netnstest: AddAddress %s: invalid prefix", p)
	}
	link := h.Link
	if link == "" {
		link = "lo"
	}
	err := h.Do(func() error { return addAddrs(link, p) })
	if err != nil {
		t.Fatalf("netnstest: %s: add address %s: %v", h.Name, p, err)
	}
	if h.node == nil || h.onLink(p.Addr()) {
		return
	}
	via := h.IPv4
	if p.Addr().Is6() {
		via = h.IPv6
	}
	host := netip.PrefixFrom(p.Addr(), p.Addr().BitLen())
	err = h.node.Do(func() error { return addRoute(h.nodeIface(), host, via) })
	if err != nil {
		t.Fatalf("netnstest: node: route %s via %s: %v", host, via, err)
	}
}

// AddRoute adds a route on the host to dst through the gateway via, which
// must be on one of the host's links; an invalid dst means the default
// route of via's family. Use it to give the node a default route through
// the client, so that the node's own flows to addresses it does not hold
// (external and load-balancer IPs) leave it as a router's would.
func (h *Host) AddRoute(t testing.TB, dst netip.Prefix, via netip.Addr) {
	t.Helper()
	err := h.Do(func() error {
		r := &netlink.Route{Gw: net.IP(via.AsSlice())}
		switch {
		case dst.IsValid():
			r.Dst = ipNet(dst)
		case via.Is6():
			r.Dst = ipNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0))
		default:
			r.Dst = ipNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
		}
		return netlink.RouteAdd(r)
	})
	if err != nil {
		t.Fatalf("netnstest: %s: route %s via %s: %v", h.Name, dst, via, err)
	}
}

// nodeIface returns the node's interface to the host: its bridge, else
// its end of the host's link.
func (h *Host) nodeIface() string {
	if h.NodeBridge != "" {
		return h.NodeBridge
	}
	return h.NodeLink
}

// onLink reports whether a lies in one of the host's link subnets.
func (h *Host) onLink(a netip.Addr) bool {
	return netip.PrefixFrom(h.IPv4, prefixLen4).Masked().Contains(a) ||
		netip.PrefixFrom(h.IPv6, prefixLen6).Masked().Contains(a)
}

// addAddrs adds addresses to a link of the calling thread's namespace,
// without duplicate address detection, and waits until the IPv6 ones
// are routed to the host and answer neighbour solicitations.
func addAddrs(link string, ps ...netip.Prefix) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return fmt.Errorf("find link %s: %w", link, err)
	}
	var v6 []netip.Addr
	for _, p := range ps {
		a := &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("add %s to %s: %w", p, link, err)
		}
		if p.Addr().Is6() {
			v6 = append(v6, p.Addr())
		}
	}
	if err := waitLocal(v6); err != nil {
		return err
	}
	if link == "lo" {
		return nil
	}
	return waitSolicited(link, v6)
}

// waitLocal waits until the namespace of the calling thread routes the
// IPv6 addresses to itself: the kernel adds the local route of a new
// address in deferred work, even without duplicate address detection,
// and a packet that comes before it is answered with "no route".
func waitLocal(addrs []netip.Addr) error {
	if len(addrs) == 0 {
		return nil
	}
	c, err := rtnl.Open(0)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.WaitLocal(context.Background(), addrs, solicitTimeout)
}

// solicitTimeout bounds the wait for IPv6 addresses to become reachable.
const solicitTimeout = 5 * time.Second

// waitSolicited waits until the link of the calling thread's namespace has
// joined the solicited-node multicast group of each address. The kernel
// joins it in deferred work after the address is added; until then the
// host ignores neighbour solicitations for the address, and a neighbour
// that asks in that window retries only a second later.
func waitSolicited(link string, addrs []netip.Addr) error {
	deadline := time.Now().Add(solicitTimeout)
	for {
		// /proc/net would show the namespace of the process's main
		// thread; thread-self shows this thread's.
		b, err := os.ReadFile("/proc/thread-self/net/igmp6")
		if err != nil {
			return fmt.Errorf("read igmp6: %w", err)
		}
		missing := missingGroups(string(b), link, addrs)
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link %s: no solicited-node multicast membership for %v after %v", link, missing, solicitTimeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// missingGroups returns the addresses whose solicited-node group
// (ff02::1:ffXX:XXXX) /proc/net/igmp6 does not list on link.
func missingGroups(igmp6, link string, addrs []netip.Addr) []netip.Addr {
	joined := map[string]bool{}
	for _, line := range strings.Split(igmp6, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[1] == link {
			joined[f[2]] = true
		}
	}
	var out []netip.Addr
	for _, a := range addrs {
		b := a.As16()
		group := fmt.Sprintf("ff0200000000000000000001ff%02x%02x%02x", b[13], b[14], b[15])
		if !joined[group] {
			out = append(out, a)
		}
	}
	return out
}

// addRoute adds a route to dst (the default route when dst is not valid
// and via gives the family) through via on link.
func addRoute(link string, dst netip.Prefix, via netip.Addr) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return fmt.Errorf("find link %s: %w", link, err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(via.AsSlice())}
	if dst.IsValid() {
		r.Dst = ipNet(dst)
	} else if via.Is6() {
		r.Dst = ipNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0))
	} else {
		r.Dst = ipNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
	}
	if err := netlink.RouteAdd(r); err != nil {
		return fmt.Errorf("route %s via %s dev %s: %w", dst, via, link, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
