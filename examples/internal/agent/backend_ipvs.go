package agent

import (
	"github.com/kproxy-dev/kproxy/ipvs"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func openIPVS(o BackendOptions) (Dataplane, error) {
	return ipvs.New(ipvs.Options{NetNS: o.NetNS, Logger: o.Logger, StrictARP: o.StrictARP})
}

// renderIPVS renders without the kernel: IPVS may be missing where a dry
// run is made.
func renderIPVS(BackendOptions) (Renderer, error) {
	p := new(ipvs.Proxier) // its capabilities need no kernel
	return offlineRenderer{render: func(st *servicelb.State) (string, error) { return ipvs.Render(st, ipvs.Options{}) }, caps: p.Capabilities()}, nil
}

// offlineRenderer renders with a function and declares capabilities.
type offlineRenderer struct {
	render func(*servicelb.State) (string, error)
	caps   servicelb.Capabilities
}

func (r offlineRenderer) Render(st *servicelb.State) (string, error) { return r.render(st) }
func (r offlineRenderer) Capabilities() servicelb.Capabilities       { return r.caps }
