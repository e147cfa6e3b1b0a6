//go:build linux

package netnstest

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Addressing of a Topology. Backend i (0-based) sits in 10.244.(i+1).0/24
// and fd00:244:(i+1)::/64; the client in 198.51.100.0/24 and fd00:c::/64.
const (
	prefixLen4  = 24
	prefixLen6  = 64
	maxBackends = 254
	// ClientLink is the node's link to the client.
	ClientLink = "ext0"
	// BackendLinkPrefix starts the default names of the node's links to
	// the backends ("veth0", "veth1", ...), as a CNI plugin's would.
	// Options.Links names some of them otherwise.
	BackendLinkPrefix = "veth"
	// HostLink is the name of a client's or backend's link to the node.
	HostLink = "eth0"
)

// NodeIPv4 and the functions below give the fixed addresses of a Topology.
func NodeIPv4() netip.Addr { return netip.MustParseAddr("198.51.100.1") }

// NodeIPv6 is the node's client-facing IPv6 address.
func NodeIPv6() netip.Addr { return netip.MustParseAddr("fd00:c::1") }

// ClientIPv4 is the client's IPv4 address.
func ClientIPv4() netip.Addr { return netip.MustParseAddr("198.51.100.2") }

// ClientIPv6 is the client's IPv6 address.
func ClientIPv6() netip.Addr { return netip.MustParseAddr("fd00:c::2") }

// BackendIPv4 is backend i's IPv4 address, 10.244.(i+1).2.
func BackendIPv4(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 2}) }

// BackendIPv6 is backend i's IPv6 address, fd00:244:(i+1)::2.
func BackendIPv6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0, 0x02, 0x44, byte((i + 1) >> 8), byte(i + 1), 15: 2})
}

// ClusterCIDRs are the prefixes holding every backend address:
// 10.244.0.0/16 and fd00:244::/32.
func ClusterCIDRs() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")}
}

// gateway returns the node's address on a host's link: the host's address
// with the last byte 1.
func gateway(a netip.Addr) netip.Addr {
	b := a.As16()
	b[15] = 1
	if a.Is4() {
		return netip.AddrFrom4([4]byte(b[12:16]))
	}
	return netip.AddrFrom16(b)
}

// Options shape a Topology.
type Options struct {
	// Backends is the number of backend hosts, 1 to 254; zero means 3.
	Backends int
	// Links shape the node's end of some backends' links, by backend
	// index; the others are BackendLinkPrefix<i>, not bridged.
	Links map[int]Link
}

// Link shapes the node's end of a backend's link, as the interface-based
// detections of local traffic see it.
type Link struct {
	// Name names the node's end instead of BackendLinkPrefix<i>: a name
	// with a prefix of its own, say, that no other link of the node
	// shares. At most 15 bytes.
	Name string
	// Bridge, when not empty, makes the node's end a port of a bridge of
	// this name in the node's namespace, created for the first backend
	// that names it and shared by the others, which holds the node's
	// addresses for the backend, as a CNI bridge plugin's does for its
	// pods: the node sees the backend's packets come in on the bridge.
	Bridge string
}

// maxLinkName is the longest interface name the kernel takes.
const maxLinkName = 15

// check refuses names the kernel would refuse or that clash.
func (o *Options) check(n int) error {
	names := map[string]bool{ClientLink: true, "lo": true}
	bridges := map[string]bool{}
	for i := range n {
		l := o.Links[i]
		name := l.Name
		if name == "" {
			name = fmt.Sprintf("%s%d", BackendLinkPrefix, i)
		}
		if len(name) > maxLinkName || len(l.Bridge) > maxLinkName {
			return fmt.Errorf("backend %d: link or bridge name longer than %d bytes", i, maxLinkName)
		}
		if names[name] || bridges[name] {
			return fmt.Errorf("backend %d: link name %q taken", i, name)
		}
		names[name] = true
		if l.Bridge != "" {
			if names[l.Bridge] {
				return fmt.Errorf("backend %d: bridge name %q is a link's", i, l.Bridge)
			}
			bridges[l.Bridge] = true
		}
	}
	for i := range o.Links {
		if i < 0 || i >= n {
			return fmt.Errorf("links: no backend %d", i)
		}
	}
	return nil
}

// Topology is a node routing between a client and backend hosts, each in
// its own network namespace. See the package documentation.
type Topology struct {
	Node     *Host
	Client   *Host
	Backends []*Host
}

// Hosts returns every host: the node, the client, then the backends.
func (tp *Topology) Hosts() []*Host {
	return append([]*Host{tp.Node, tp.Client}, tp.Backends...)
}

// NodeIPs returns the node's client-facing addresses, IPv4 then IPv6.
func (tp *Topology) NodeIPs() []netip.Addr { return []netip.Addr{tp.Node.IPv4, tp.Node.IPv6} }

// New builds a topology and registers its removal with t.Cleanup. It calls
// Require(t), so it skips (or fails under CI=true) without root, and it
// removes the namespaces that crashed runs left behind.
func New(t testing.TB, o Options) *Topology {
	t.Helper()
	Require(t)
	n := o.Backends
	if n == 0 {
		n = 3
	}
	if n < 1 || n > maxBackends {
		t.Fatalf("netnstest: Options.Backends %d out of range 1..%d", o.Backends, maxBackends)
	}
	if err := o.check(n); err != nil {
		t.Fatalf("netnstest: Options: %v", err)
	}
	setup(t)
	token := newToken()
	tp := &Topology{Node: newHost(t, token, "node"), Client: newHost(t, token, "client")}
	tp.Node.IPv4, tp.Node.IPv6 = NodeIPv4(), NodeIPv6()
	tp.Client.IPv4, tp.Client.IPv6 = ClientIPv4(), ClientIPv6()
	tp.Client.NodeLink = ClientLink
	for i := range n {
		b := newHost(t, token, fmt.Sprintf("backend-%d", i))
		b.IPv4, b.IPv6 = BackendIPv4(i), BackendIPv6(i)
		b.NodeLink = fmt.Sprintf("%s%d", BackendLinkPrefix, i)
		if l := o.Links[i]; l.Name != "" {
			b.NodeLink = l.Name
		}
		b.NodeBridge = o.Links[i].Bridge
		tp.Backends = append(tp.Backends, b)
	}
	for _, h := range append([]*Host{tp.Client}, tp.Backends...) {
		if err := tp.link(h); err != nil {
			t.Fatalf("netnstest: link %s: %v", h.Name, err)
		}
	}
	sysctls := nodeSysctls()
	if slices.ContainsFunc(tp.Backends, func(b *Host) bool { return b.NodeBridge != "" }) {
		sysctls = append(sysctls, bridgeSysctls()...)
	}
	if err := tp.Node.Do(func() error { return writeSysctls(sysctls) }); err != nil {
		t.Fatalf("netnstest: node: %v", err)
	}
	for _, h := range tp.Hosts() {
		if err := h.Do(waitLinksUp); err != nil {
			t.Fatalf("netnstest: %s: %v", h.Name, err)
		}
	}
	return tp
}

// linkUpTimeout bounds the wait for links to come up.
const linkUpTimeout = 10 * time.Second

// waitLinksUp waits until every veth link of the calling thread's
// namespace is operationally up. Until the kernel's link watcher has seen a
// new link's carrier, the link has no queueing discipline attached and
// drops every packet sent through it.
func waitLinksUp() error {
	deadline := time.Now().Add(linkUpTimeout)
	for {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		var down []string
		for _, l := range links {
			if l.Type() == "veth" && l.Attrs().OperState != netlink.OperUp {
				down = append(down, fmt.Sprintf("%s (%s)", l.Attrs().Name, l.Attrs().OperState))
			}
		}
		if len(down) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("links not up after %v: %v", linkUpTimeout, down)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// link connects h to the node with a veth pair created in the node's
// namespace, its peer created directly in h's, and addresses and routes
// them. A bridged host's node end joins its bridge, which holds the
// node's addresses.
func (tp *Topology) link(h *Host) error {
	h.node = tp.Node
	h.Link = HostLink
	h.Gateway4, h.Gateway6 = gateway(h.IPv4), gateway(h.IPv6)
	node := []netip.Prefix{netip.PrefixFrom(h.Gateway4, prefixLen4), netip.PrefixFrom(h.Gateway6, prefixLen6)}
	err := tp.Node.Do(func() error {
		if err := addVeth(h.NodeLink, h.Link, h.NS); err != nil {
			return err
		}
		if h.NodeBridge != "" {
			if err := joinBridge(h.NodeLink, h.NodeBridge); err != nil {
				return err
			}
		}
		if err := addAddrs(h.nodeIface(), node...); err != nil {
			return err
		}
		return setUp(h.NodeLink)
	})
	if err != nil {
		return fmt.Errorf("node side: %w", err)
	}
	own := []netip.Prefix{netip.PrefixFrom(h.IPv4, prefixLen4), netip.PrefixFrom(h.IPv6, prefixLen6)}
	err = h.Do(func() error {
		if err := addAddrs(h.Link, own...); err != nil {
			return err
		}
		if err := setUp(h.Link); err != nil {
			return err
		}
		if err := addRoute(h.Link, netip.Prefix{}, h.Gateway4); err != nil {
			return err
		}
		return addRoute(h.Link, netip.Prefix{}, h.Gateway6)
	})
	if err != nil {
		return fmt.Errorf("%s side: %w", h.Name, err)
	}
	return nil
}

// addVeth creates a veth pair in the calling thread's namespace: name
// stays here, peer is created directly in the namespace peerNS.
func addVeth(name, peer string, peerNS netns.NsHandle) error {
	if !peerNS.IsOpen() {
		return fmt.Errorf("veth %s: peer namespace handle is not open", name)
	}
	la := netlink.NewLinkAttrs()
	la.Name = name
	v := &netlink.Veth{LinkAttrs: la, PeerName: peer, PeerNamespace: netlink.NsFd(int(peerNS))}
	if err := netlink.LinkAdd(v); err != nil {
		return fmt.Errorf("add veth %s (peer %s): %w", name, peer, err)
	}
	return nil
}

// joinBridge makes link a port of the bridge of the calling thread's
// namespace, creating the bridge (up, without STP, so that ports forward
// at once) if it is not there yet.
func joinBridge(link, bridge string) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return fmt.Errorf("add bridge %s: %w", bridge, err)
		}
		if br, err = netlink.LinkByName(bridge); err != nil {
			return fmt.Errorf("find bridge %s: %w", bridge, err)
		}
		if err := netlink.LinkSetUp(br); err != nil {
			return fmt.Errorf("set %s up: %w", bridge, err)
		}
	}
	l, err := netlink.LinkByName(link)
	if err != nil {
		return fmt.Errorf("find link %s: %w", link, err)
	}
	if err := netlink.LinkSetMaster(l, br); err != nil {
		return fmt.Errorf("add %s to bridge %s: %w", link, bridge, err)
	}
	return nil
}

// setUp sets a link of the calling thread's namespace up.
func setUp(link string) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return fmt.Errorf("find link %s: %w", link, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", link, err)
	}
	return nil
}
