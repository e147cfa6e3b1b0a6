package agent

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/userspace"
)

// UserspaceFlags are the userspace backend's settings (userspace.Options),
// as flags.
type UserspaceFlags struct {
	// NoHoldAddresses leaves the services' cluster, external and
	// load-balancer IPs off the loopback: the proxy then needs no
	// privilege, and serves node ports on the node's addresses and the
	// service ports ListenAt names.
	NoHoldAddresses bool
	// ListenAt serves service ports at addresses and ports of their own:
	// comma-separated SERVICE[:PORT]=ADDRESS:PORT (userspace.ListenAt).
	ListenAt string
	// ConnectTimeout, IdleTimeout, DrainTimeout, UDPIdleTimeout,
	// StallTimeout, MaxFlows and MaxPortFlows are userspace.Options' own;
	// zero means the package's default.
	ConnectTimeout, IdleTimeout, DrainTimeout, UDPIdleTimeout, UDPStreamTimeout, StallTimeout time.Duration
	MaxFlows, MaxPortFlows                                                                    int
	// HandoverSocket is the Unix socket over which a newer kproxy takes
	// this one's listening sockets and connections, and this one an
	// older one's (userspace.Proxier.HandOver); empty for none.
	HandoverSocket string
}

func (u *UserspaceFlags) register(fs *flag.FlagSet) {
	fs.BoolFunc("userspace-hold-addresses", "userspace: hold the services' cluster, external and load-balancer IPs on the loopback, so that their traffic reaches the listeners (needs CAP_NET_ADMIN); false needs no privilege: node ports are served on the node's addresses, and the service ports --userspace-listen-at names where it says (default true)",
		func(s string) error {
			hold, err := strconv.ParseBool(s)
			u.NoHoldAddresses = !hold
			return err
		})
	fs.StringVar(&u.ListenAt, "userspace-listen-at", "", "userspace: serve service ports at addresses and ports of their own, comma-separated SERVICE[:PORT]=ADDRESS:PORT "+
		"(such as demo/web:http=127.0.0.1:18080; PORT is the port's name, left out for an unnamed port); the flows follow the verdicts of the port's cluster IP")
	fs.DurationVar(&u.ConnectTimeout, "userspace-connect-timeout", 0, fmt.Sprintf("userspace: bound on each attempt to connect to an endpoint (default %v)", userspace.DefaultConnectTimeout))
	fs.DurationVar(&u.IdleTimeout, "userspace-idle-timeout", 0, fmt.Sprintf("userspace: close a TCP or SCTP connection that moved nothing either way for this long; negative for never (default %v)", userspace.DefaultIdleTimeout))
	fs.DurationVar(&u.DrainTimeout, "userspace-drain-timeout", 0, "userspace: close a connection to an endpoint that stopped serving after this long (default: let it run until it ends)")
	fs.DurationVar(&u.UDPIdleTimeout, "userspace-udp-idle-timeout", 0, fmt.Sprintf("userspace: end a UDP session that carried no datagram either way for this long (default %v)", userspace.DefaultUDPIdleTimeout))
	fs.DurationVar(&u.UDPStreamTimeout, "userspace-udp-stream-timeout", 0, fmt.Sprintf("userspace: end a UDP session that has become a stream (a reply, and datagrams 2s on) after this long without a datagram (default %v)", userspace.DefaultUDPStreamTimeout))
	fs.DurationVar(&u.StallTimeout, "userspace-stall-timeout", 0, fmt.Sprintf("userspace: reset a TCP connection whose receiver takes none of the bytes the proxy holds for it for this long; negative for never (default %v)", userspace.DefaultStallTimeout))
	fs.IntVar(&u.MaxFlows, "userspace-max-flows", 0, "userspace: the most connections and UDP sessions held at once; new ones beyond are shed (default: what the descriptor limit leaves after a reserve)")
	fs.StringVar(&u.HandoverSocket, "userspace-handover-socket", "", "userspace: a Unix socket path: at start, take the listening sockets and connections of the kproxy listening there, "+
		"then listen there for the next one, and exit once it took them: a restart or an upgrade with the two processes overlapping cuts no connection")
	fs.IntVar(&u.MaxPortFlows, "userspace-max-port-flows", 0, "userspace: the most connections and UDP sessions of one service port (default: half of --userspace-max-flows)")
}

// Options returns the userspace.Options the flags describe (without the
// namespace and the logger, which the agent sets).
func (u UserspaceFlags) Options() (userspace.Options, error) {
	o := userspace.Options{HoldAddresses: !u.NoHoldAddresses, ConnectTimeout: u.ConnectTimeout,
		IdleTimeout: u.IdleTimeout, DrainTimeout: u.DrainTimeout, UDPIdleTimeout: u.UDPIdleTimeout, UDPStreamTimeout: u.UDPStreamTimeout, StallTimeout: u.StallTimeout,
		MaxFlows: u.MaxFlows, MaxPortFlows: u.MaxPortFlows}
	var errs []error
	for name, d := range map[string]time.Duration{"connect": u.ConnectTimeout, "drain": u.DrainTimeout, "udp-idle": u.UDPIdleTimeout, "udp-stream": u.UDPStreamTimeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("--userspace-%s-timeout %v: want a positive duration", name, d))
		}
	}
	for name, n := range map[string]int{"max-flows": u.MaxFlows, "max-port-flows": u.MaxPortFlows} {
		if n < 0 {
			errs = append(errs, fmt.Errorf("--userspace-%s %d: want a positive number", name, n))
		}
	}
	at := map[servicelb.ServicePortKey]netip.AddrPort{}
	for _, f := range splitList(u.ListenAt) {
		k, a, err := parseListenAt(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("--userspace-listen-at %q: %w", f, err))
			continue
		}
		if _, dup := at[k]; dup {
			errs = append(errs, fmt.Errorf("--userspace-listen-at: %s given twice", k))
		}
		at[k] = a
	}
	o.Listen = listenFunc(at, o.HoldAddresses)
	return o, errors.Join(errs...)
}

// listenFunc says where the proxy listens: the first frontend of a
// service port named in at (its cluster IP) there (userspace.ListenAt);
// any other frontend at its own address and port, which without held
// addresses only node ports have (on the node's addresses): the others
// are then not served. Nil when that is the package's default.
func listenFunc(at map[servicelb.ServicePortKey]netip.AddrPort, hold bool) userspace.ListenFunc {
	if len(at) == 0 && hold {
		return nil
	}
	named := userspace.ListenAt(at)
	return func(sp *servicelb.ServicePort, f servicelb.Frontend) (netip.AddrPort, bool) {
		if a, ok := named(sp, f); ok {
			return a, true
		}
		return f.AddrPort(), hold || f.Kind == servicelb.NodePortFrontend
	}
}

// parseListenAt parses SERVICE[:PORT]=ADDRESS:PORT; the address's family
// is the service port's.
func parseListenAt(s string) (servicelb.ServicePortKey, netip.AddrPort, error) {
	port, addr, ok := strings.Cut(s, "=")
	if !ok {
		return servicelb.ServicePortKey{}, netip.AddrPort{}, errors.New("want SERVICE[:PORT]=ADDRESS:PORT")
	}
	a, err := netip.ParseAddrPort(addr)
	if err != nil || a.Port() == 0 || a.Addr().IsUnspecified() {
		return servicelb.ServicePortKey{}, netip.AddrPort{}, fmt.Errorf("%q: want an address and a port, such as 127.0.0.1:18080", addr)
	}
	k := servicelb.ServicePortKey{Family: servicelb.IPv4}
	if a.Addr().Is6() {
		k.Family = servicelb.IPv6
	}
	k.Service, k.Port, _ = strings.Cut(port, ":")
	if k.Service == "" {
		return servicelb.ServicePortKey{}, netip.AddrPort{}, errors.New("no service name")
	}
	return k, a, nil
}
