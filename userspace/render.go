//go:build linux

package userspace

import (
	"fmt"
	"strings"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Render returns what a Proxier with options o would hold and listen on
// for st; see Proxier.Render. It needs no privilege.
func Render(st *servicelb.State, o Options) (string, error) {
	p, err := ForRendering(o)
	if err != nil {
		return "", err
	}
	return p.Render(st)
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
