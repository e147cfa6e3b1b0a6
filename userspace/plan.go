//go:build linux

package userspace

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

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

// Render returns what the proxy would serve for st, one service port at a
// time: the addresses it holds, and for each listener the frontend it
// serves, the verdicts by origin and the endpoints. It needs no
// privileges and touches nothing.
func (p *Proxier) Render(st *servicelb.State) (string, error) {
	if err := st.Check(); err != nil {
		return "", fmt.Errorf("userspace: render: %w", err)
	}
	caps, n := p.Capabilities(), st.Node()
	if err := caps.CheckNode(&n); err != nil {
		return "", err
	}
	pl := newPlanner(&p.o, n, nil)
	var b strings.Builder
	var errs []error
	taken := map[listenKey]string{}
	held := map[netip.Addr]bool{}
	for _, sp := range st.Ports() {
		if err := caps.CheckPort(sp); err != nil {
			errs = append(errs, err)
			continue
		}
		fs, err := pl.fronts(sp)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, f := range fs {
			if other, ok := taken[f.key]; ok {
				errs = append(errs, leftOut(sp, portField(sp), &ListenError{Protocol: f.key.proto, At: f.key.at.String(),
					Err: fmt.Errorf("%w (by %s)", errListenTaken, other)}))
				continue
			}
			taken[f.key] = sp.Key.String()
			if f.hold {
				held[f.key.at.Addr()] = true
			}
		}
		renderPort(&b, sp, fs)
	}
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	var head strings.Builder
	head.WriteString("# kproxy userspace proxy\n")
	for _, a := range slices.SortedFunc(maps.Keys(held), netip.Addr.Compare) {
		fmt.Fprintf(&head, "hold %s on %s\n", a, p.o.Link)
	}
	return head.String() + b.String(), nil
}

// actions formats the actions of verdicts by origin, such as
// "outside=local pod=cluster node=cluster": masquerade says nothing here,
// since every endpoint sees the proxy's address.
func actions(vs servicelb.Verdicts) string {
	var parts []string
	for _, o := range servicelb.Origins() {
		parts = append(parts, fmt.Sprintf("%s=%s", o, vs.Of(o).Action))
	}
	return strings.Join(parts, " ")
}

// renderPort writes one service port: its listeners, then its decision.
func renderPort(b *strings.Builder, sp *servicelb.ServicePort, fs []front) {
	fmt.Fprintf(b, "\nport %s %s\n", sp.Key, sp.Port.Protocol.Lower())
	for _, f := range fs {
		if !f.listen {
			fmt.Fprintf(b, "  no listener at %s for %s: reject\n", f.key.at, f.kind)
			continue
		}
		fmt.Fprintf(b, "  listen %s for %s: %s\n", f.key.at, f.kind, actions(sp.Verdicts(f.kind)))
	}
	if len(fs) == 0 {
		b.WriteString("  not served: Options.Listen puts no frontend anywhere\n")
	}
	for _, set := range []struct {
		name string
		a    servicelb.Action
		bs   []servicelb.Backend
	}{{"cluster", servicelb.ToCluster, sp.Cluster}, {"local", servicelb.ToLocal, sp.Local}} {
		if !sp.Uses(set.a) {
			continue
		}
		fmt.Fprintf(b, "  %s:", set.name)
		for _, be := range set.bs {
			fmt.Fprintf(b, " %s weight %d", be.AddrPort(), be.Weight)
		}
		b.WriteString("\n")
	}
	if sp.Scheduler != "" {
		fmt.Fprintf(b, "  scheduler %s\n", sp.Scheduler)
	}
	if sp.Affinity > 0 {
		fmt.Fprintf(b, "  affinity %ds\n", int(sp.Affinity.Seconds()))
	}
	if len(sp.SourceRanges) > 0 {
		fmt.Fprintf(b, "  source ranges %v\n", sp.SourceRanges)
	}
}
