// Package sandbox builds a small network of throwaway network namespaces to
// run a load balancer in: a node that routes, a client, and backend hosts
// that serve HTTP. The demo and the agents' packet tests use it.
//
// Topology (N backends, 1 <= N <= 200):
//
//	client 10.100.0.2/24 ─ veth ─ 10.100.0.1 node 10.100.i.1 ─ veth ─ 10.100.i.2/24 backend-i
//
// The client and every backend route everything through the node, which
// forwards between its links. Service addresses (cluster IPs, such as
// 10.96.0.10) are routed to the node and exist only in the rules a
// load balancer installs there. 10.100.0.1 is the node's address: node
// ports are reached on it.
//
// Safety: the caller's network namespace (normally the root one) is never
// changed. Every namespace is created on a thread of its own, veth pairs
// are created inside the node namespace with their peer moved straight
// into the other namespace, and every address, route and sysctl is set
// through a handle opened in the namespace it belongs to. Namespaces are
// named "kpxsb-<pid>-<random>-<role>" and bind-mounted in /run/netns,
// so `ip netns exec` reaches them while the sandbox lives; Close deletes
// them and Reap deletes those of processes that are gone.
//
// A sandbox needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the veth
// driver.
package sandbox

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Options configure a sandbox.
type Options struct {
	// Backends is the number of backend hosts; default 3.
	Backends int
	// Logger receives progress at Debug; nil discards.
	Logger *slog.Logger
	// RequestTimeout bounds each request of Distribute and Eventually;
	// default DefaultRequestTimeout. Slow machines (an emulated VM) want
	// more.
	RequestTimeout time.Duration
}

// Host is one namespace of the sandbox.
type Host struct {
	// Name is the host's role: "node", "client" or "backend-<i>".
	Name string
	// NSName is the namespace's name in /run/netns.
	NSName string
	// NS is a handle to the namespace, valid until Close.
	NS netns.NsHandle
	// Addr is the host's address: the node's address towards the client,
	// or the client's or a backend's own.
	Addr netip.Addr

	mu      sync.Mutex
	servers []*server
}

// Sandbox is a node, a client and backend hosts, connected by veth pairs.
type Sandbox struct {
	Node     *Host
	Client   *Host
	Backends []*Host

	log     *slog.Logger
	timeout time.Duration
	closed  bool
}

// ErrNotRoot is returned when the process lacks the privileges to create
// namespaces.
var ErrNotRoot = errors.New("sandbox: needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to create network namespaces")

// CheckRoot returns ErrNotRoot unless the process runs as root.
func CheckRoot() error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	return nil
}

// NodeAddr is the node's address on the client link: where node ports are
// reached.
var NodeAddr = netip.MustParseAddr("10.100.0.1")

// ClientAddr is the client's address.
var ClientAddr = netip.MustParseAddr("10.100.0.2")

// BackendAddr returns the address of backend i (1-based).
func BackendAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 100, byte(i), 2}) }

// New builds a sandbox. On error everything it created is removed.
func New(o Options) (*Sandbox, error) {
	if err := CheckRoot(); err != nil {
		return nil, err
	}
	if o.Backends == 0 {
		o.Backends = 3
	}
	if o.Backends < 1 || o.Backends > 200 {
		return nil, fmt.Errorf("sandbox: %d backends, want 1 to 200", o.Backends)
	}
	sb := &Sandbox{log: o.Logger, timeout: cmp.Or(o.RequestTimeout, DefaultRequestTimeout)}
	if sb.log == nil {
		sb.log = slog.New(slog.DiscardHandler)
	}
	if _, err := Reap(); err != nil {
		sb.log.Warn("reaping old sandboxes", "err", err)
	}
	if err := sb.build(o.Backends); err != nil {
		return nil, errors.Join(err, sb.Close())
	}
	return sb, nil
}

func (sb *Sandbox) build(backends int) error {
	var tag [3]byte
	if _, err := rand.Read(tag[:]); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	base := fmt.Sprintf("%s%d-%s-", Prefix, os.Getpid(), hex.EncodeToString(tag[:]))
	var err error
	if sb.Node, err = newHost(base, "node", NodeAddr); err != nil {
		return err
	}
	if sb.Client, err = newHost(base, "client", ClientAddr); err != nil {
		return err
	}
	for i := 1; i <= backends; i++ {
		h, err := newHost(base, fmt.Sprintf("backend-%d", i), BackendAddr(i))
		if err != nil {
			return err
		}
		sb.Backends = append(sb.Backends, h)
	}
	return sb.wire()
}

func newHost(base, role string, addr netip.Addr) (*Host, error) {
	h := &Host{Name: role, NSName: base + role, Addr: addr, NS: netns.None()}
	ns, err := createNamed(h.NSName)
	if err != nil {
		return h, err
	}
	h.NS = ns
	return h, nil
}

// wire connects the hosts and configures addresses, routes and forwarding.
func (sb *Sandbox) wire() error {
	node, err := netlink.NewHandleAt(sb.Node.NS, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("sandbox: netlink in %s: %w", sb.Node.NSName, err)
	}
	defer node.Close()
	if err := linkUp(node, "lo"); err != nil {
		return err
	}
	if err := sb.connect(node, "cl0", sb.Client, NodeAddr, ClientAddr); err != nil {
		return err
	}
	for i, b := range sb.Backends {
		gw := netip.AddrFrom4([4]byte{10, 100, byte(i + 1), 1})
		if err := sb.connect(node, fmt.Sprintf("be%d", i+1), b, gw, b.Addr); err != nil {
			return err
		}
	}
	return In(sb.Node.NS, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
}

// connect creates a veth pair in the node namespace, moves its peer into
// host as eth0, and gives both ends an address in a /24 with a default
// route on the host's side through the node.
func (sb *Sandbox) connect(node *netlink.Handle, name string, host *Host, nodeAddr, hostAddr netip.Addr) error {
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(host.NS)),
	}
	if err := node.LinkAdd(veth); err != nil {
		return fmt.Errorf("sandbox: add veth %s to %s: %w", name, host.Name, err)
	}
	if err := addAddr(node, name, nodeAddr); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(host.NS, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("sandbox: netlink in %s: %w", host.NSName, err)
	}
	defer h.Close()
	if err := linkUp(h, "lo"); err != nil {
		return err
	}
	if err := addAddr(h, "eth0", hostAddr); err != nil {
		return err
	}
	link, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("sandbox: %s eth0: %w", host.Name, err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: net.IP(nodeAddr.AsSlice())}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("sandbox: default route in %s: %w", host.Name, err)
	}
	sb.log.Debug("sandbox: connected", "host", host.Name, "addr", hostAddr, "via", nodeAddr)
	return nil
}

func addAddr(h *netlink.Handle, link string, a netip.Addr) error {
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("sandbox: link %s: %w", link, err)
	}
	ipnet := &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(24, 32)}
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipnet}); err != nil {
		return fmt.Errorf("sandbox: address %s on %s: %w", a, link, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("sandbox: set %s up: %w", link, err)
	}
	return nil
}

func linkUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("sandbox: link %s: %w", name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("sandbox: set %s up: %w", name, err)
	}
	return nil
}

// Hosts returns every host: the node, the client and the backends.
func (sb *Sandbox) Hosts() []*Host {
	var out []*Host
	for _, h := range append([]*Host{sb.Node, sb.Client}, sb.Backends...) {
		if h != nil {
			out = append(out, h)
		}
	}
	return out
}

// Close stops the servers and deletes every namespace. It may be called
// more than once.
func (sb *Sandbox) Close() error {
	if sb.closed {
		return nil
	}
	sb.closed = true
	var errs []error
	for _, h := range sb.Hosts() {
		h.stopServers()
		if h.NS.IsOpen() {
			errs = append(errs, h.NS.Close())
		}
		errs = append(errs, deleteNamed(h.NSName))
	}
	return errors.Join(errs...)
}
