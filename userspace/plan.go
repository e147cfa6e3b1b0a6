//go:build linux

package userspace

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// front is one frontend of a service port as the proxy serves it: where
// it listens, for which kind of frontend, whether its address goes on the
// link, and whether it listens at all: a frontend that rejects every flow
// (its port has no endpoint anywhere) has no listener, so that the kernel
// refuses its flows at once, an ICMP port unreachable for UDP and a reset
// for TCP (an abort for SCTP), and its address stays held.
type front struct {
	key    listenKey
	kind   servicelb.FrontendKind
	hold   bool
	listen bool
}

// errListenTaken: two frontends listen at one address and port.
var errListenTaken = errors.New("listened on for another frontend")

// planner turns service ports into listeners: the options and the node's
// addresses (which the proxy never holds: they are the node's).
type planner struct {
	o         *Options
	nodeAddrs map[netip.Addr]bool
}

// newPlanner returns the planner of node n. The addresses in own are
// those the proxy holds: a node config that lists one of them (from a
// listing of the namespace's addresses that took the proxy's link in)
// does not make it the node's, which would release it and flap.
func newPlanner(o *Options, n servicelb.NodeConfig, own map[netip.Addr]bool) planner {
	pl := planner{o: o, nodeAddrs: map[netip.Addr]bool{}}
	for _, a := range slices.Concat(n.NodeIPs, n.LocalIPs) {
		if !own[a] {
			pl.nodeAddrs[a] = true
		}
	}
	return pl
}

// fronts returns the listeners of sp: one per frontend, where
// Options.Listen puts it.
func (pl planner) fronts(sp *servicelb.ServicePort) ([]front, error) {
	fs := sp.Frontends()
	out := make([]front, 0, len(fs))
	for _, f := range fs {
		at := f.AddrPort()
		if pl.o.Listen != nil {
			var ok bool
			if at, ok = pl.o.Listen(sp, f); !ok {
				continue
			}
			if !at.IsValid() || at.Port() == 0 || at.Addr().IsUnspecified() || at.Addr().Zone() != "" {
				return nil, leftOut(sp, portField(sp), &ListenError{Protocol: sp.Port.Protocol, At: at.String(),
					Err: fmt.Errorf("%w: Options.Listen gave no address and port to listen at for %s", ErrInvalidOptions, f)})
			}
		}
		a := at.Addr()
		v, uniform := sp.Verdicts(f.Kind).Uniform()
		out = append(out, front{
			key:    listenKey{proto: sp.Port.Protocol, at: at},
			kind:   f.Kind,
			hold:   pl.o.HoldAddresses && !a.IsLoopback() && !pl.nodeAddrs[a],
			listen: !uniform || v.Action != servicelb.Reject,
		})
	}
	return out, nil
}
