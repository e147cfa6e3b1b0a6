package userspace

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Defaults of Options.
const (
	DefaultLink             = "lo"
	DefaultAddressProtocol  = 0x6b // 'k'
	DefaultConnectTimeout   = time.Second
	DefaultDialAttempts     = 4
	DefaultIdleTimeout      = 24 * time.Hour
	DefaultUDPIdleTimeout   = 30 * time.Second
	DefaultUDPStreamTimeout = 120 * time.Second
	DefaultStallTimeout     = 5 * time.Minute
	DefaultMaxUDPSessions   = 16384
)

// Options configure a Proxier. The zero value is usable: no privileges,
// every frontend served on its own address and port in the caller's
// network namespace (which works for the frontends whose addresses the
// node already has: node ports on node addresses), kube-proxy's timeouts.
type Options struct {
	// NetNS is the network namespace whose traffic the proxy serves: its
	// listeners and the connections to endpoints are made there. Zero (or
	// netns.None()) means the caller's. Another namespace needs
	// CAP_SYS_ADMIN to enter.
	NetNS netns.NsHandle
	// HoldAddresses puts every address the proxy listens on that is not
	// the node's own (cluster IPs, external and load-balancer IPs) on
	// Link, so that the kernel takes traffic to it in locally, where the
	// listeners accept it. It needs CAP_NET_ADMIN in NetNS and Linux 5.18
	// or later (the addresses are marked as the proxy's with
	// AddressProtocol).
	HoldAddresses bool
	// Link is the link that holds the addresses: DefaultLink, the
	// namespace's loopback, or the name of a dummy link, which the proxy
	// creates where the kernel has dummy links and Cleanup deletes (a
	// dummy link of that name that someone else made serves too, and
	// Cleanup leaves it).
	Link string
	// StrictARP sets net.ipv4.conf.all.arp_ignore=1 and arp_announce=2 in
	// NetNS with HoldAddresses, so that the node answers no ARP request
	// for the addresses it holds on Link (cluster, external and
	// load-balancer IPs) on its other links, nor names one in its own ARP
	// requests: with a neighbour or a load-balancer announcer (keepalived,
	// MetalLB's L2 mode) owning an external or load-balancer IP, every
	// node that answered for it would take its traffic at random. The
	// settings are the namespace's, as the ipvs backend's StrictARP:
	// every address of the node is then answered for on its own link
	// only. Without it, Capabilities lack servicelb.FeatureNoARPAnswers.
	// IPv6 needs nothing: a node answers neighbour solicitations only for
	// the addresses of the link they come in on.
	StrictARP bool
	// AddressProtocol marks the addresses the proxy holds (the address's
	// protocol, IFA_PROTO; `ip address` shows it as "proto"), so that a
	// restarted proxy adopts them and Cleanup removes them and nothing
	// else; default DefaultAddressProtocol. Two proxies in one namespace
	// need different marks.
	AddressProtocol uint8
	// Listen says where the proxy listens for each frontend of a service
	// port: ok false leaves the frontend unserved. Nil listens on every
	// frontend's own address and port. See ListenAt for the unprivileged
	// case of one configured address and port per service port.
	Listen ListenFunc
	// ConnectTimeout bounds each attempt to connect to an endpoint;
	// default DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// DialAttempts bounds the endpoints a new connection tries, each
	// after the one before refused it or did not answer in
	// ConnectTimeout; default DefaultDialAttempts.
	DialAttempts int
	// IdleTimeout closes a TCP or SCTP connection through the proxy that
	// moved no data either way for that long; default
	// DefaultIdleTimeout (kube-proxy's conntrack timeout for established
	// TCP), negative for none. Keepalives (on both sides) find dead
	// peers sooner.
	IdleTimeout time.Duration
	// StallTimeout resets a TCP connection whose proxy holds bytes for a
	// receiver that takes none of them for that long, freeing them (a
	// pipe of up to 1 MiB, and the sockets' buffers). A receiver that
	// reads again within it loses nothing; one that never does (a peer
	// that stopped reading, an endpoint that never reads the upload of a
	// client that has left) cannot keep them for IdleTimeout. The
	// kernel's backends hold no byte, so they need no such bound. Default
	// DefaultStallTimeout; negative for none.
	StallTimeout time.Duration
	// UDPIdleTimeout ends a UDP session (a client address and port and
	// the endpoint it reached) that carried no datagram either way for
	// that long; default DefaultUDPIdleTimeout. UDPStreamTimeout replaces
	// it for a session that has become a stream: one that has had a reply
	// and carries a datagram either way 2 s after it began or later, as
	// conntrack keeps an assured UDP flow (nf_conntrack_udp_timeout and
	// nf_conntrack_udp_timeout_stream); default DefaultUDPStreamTimeout.
	UDPIdleTimeout, UDPStreamTimeout time.Duration
	// MaxUDPSessions bounds the UDP sessions of one listener; datagrams
	// of new clients beyond it are dropped. Default DefaultMaxUDPSessions.
	MaxUDPSessions int
	// MaxFlows bounds the TCP and SCTP connections and UDP sessions the
	// proxy holds at once, over all its ports, and MaxPortFlows those of
	// one service port: a new flow beyond either is shed at once (a
	// connection reset, a new UDP client's datagram dropped) and counted
	// (PortStats.Shed), with a warning at most every 10 s. MaxFlows
	// defaults to DefaultMaxFlows(), what the process's descriptor limit
	// leaves after a reserve for everything else; MaxPortFlows to half of
	// MaxFlows, so that a flood on one service leaves the others room.
	MaxFlows, MaxPortFlows int
	// DrainTimeout bounds how long a TCP or SCTP connection to an
	// endpoint that stopped serving its port (or to a service port that
	// went away) keeps running; zero lets it run until it ends, as the
	// kernel's backends do.
	DrainTimeout time.Duration
	// TakeOver, when set, is a connection (SOCK_SEQPACKET) to an older
	// proxy's HandOver: New takes its listening sockets, and the first
	// Sync, once it serves with them, its TCP connections, which then run
	// on without a break (see HandOver). A handover that fails leaves
	// the Proxier to open its own listeners, as without it. The Proxier
	// closes the connection once the handover is over.
	TakeOver *net.UnixConn
	// Logger receives state changes at Info and per-sync detail at Debug;
	// nil discards. Nothing is logged per connection.
	Logger *slog.Logger
	// Hooks are called on events, for metrics.
	Hooks Hooks
}

// Hooks are called from the proxy's goroutines; each is optional and must
// be quick. Counters are read with Proxier.Stats.
type Hooks struct {
	// DialError is called when connecting to an endpoint fails; the
	// connection then tries another, up to Options.DialAttempts.
	DialError func(key servicelb.ServicePortKey, endpoint netip.AddrPort, err error)
}

// ListenFunc says where the proxy listens for frontend f of service port
// sp (whose protocol is sp.Port.Protocol): at, or nowhere when ok is
// false. It must give the same answer for the same frontend every time.
// Two frontends must not share an address and port of one protocol: the
// second service is left out with servicelb.ErrFrontendTaken.
type ListenFunc func(sp *servicelb.ServicePort, f servicelb.Frontend) (at netip.AddrPort, ok bool)

// ListenAt returns a ListenFunc that serves each service port named in m
// at its address and port, for the port's first frontend (its cluster IP
// when it has one), and serves no other frontend: the unprivileged setup
// of a developer laptop or a CI runner, where the proxy binds addresses
// the host already has (127.0.0.1 and a port of its own per service
// port). Flows to such a listener follow the verdicts of the frontend it
// stands for.
func ListenAt(m map[servicelb.ServicePortKey]netip.AddrPort) ListenFunc {
	return func(sp *servicelb.ServicePort, f servicelb.Frontend) (netip.AddrPort, bool) {
		at, ok := m[sp.Key]
		if !ok {
			return netip.AddrPort{}, false
		}
		fs := sp.Frontends()
		return at, len(fs) > 0 && fs[0] == f
	}
}

func (o Options) withDefaults() (Options, error) {
	if o.Link == "" {
		o.Link = DefaultLink
	}
	if o.AddressProtocol == 0 {
		o.AddressProtocol = DefaultAddressProtocol
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.DialAttempts == 0 {
		o.DialAttempts = DefaultDialAttempts
	}
	o.IdleTimeout = orNever(o.IdleTimeout, DefaultIdleTimeout)
	if o.UDPIdleTimeout == 0 {
		o.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if o.UDPStreamTimeout == 0 {
		o.UDPStreamTimeout = DefaultUDPStreamTimeout
	}
	o.StallTimeout = orNever(o.StallTimeout, DefaultStallTimeout)
	if o.MaxUDPSessions == 0 {
		o.MaxUDPSessions = DefaultMaxUDPSessions
	}
	switch {
	case o.ConnectTimeout < 0, o.DialAttempts < 0, o.UDPIdleTimeout < 0, o.UDPStreamTimeout < 0, o.MaxUDPSessions < 0, o.DrainTimeout < 0,
		o.MaxFlows < 0, o.MaxPortFlows < 0:
		return o, fmt.Errorf("userspace: %w: negative timeout or bound", ErrInvalidOptions)
	case o.StrictARP && !o.HoldAddresses:
		return o, fmt.Errorf("userspace: %w: StrictARP guards held addresses; it needs HoldAddresses", ErrInvalidOptions)
	case len(o.Link) >= 16:
		return o, fmt.Errorf("userspace: %w: link name %q longer than 15 bytes", ErrInvalidOptions, o.Link)
	}
	return o, nil
}

// orNever returns a timeout option's value: def for zero, zero (never)
// for a negative one.
func orNever(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}
