package agent

import (
	"github.com/kproxy-dev/kproxy/ipvs"
)

func openIPVS(o BackendOptions) (Dataplane, error) {
	return ipvs.New(ipvs.Options{NetNS: o.NetNS, Logger: o.Logger, StrictARP: o.StrictARP})
}

// renderIPVS renders without the kernel: IPVS may be missing where a dry
// run is made.
func renderIPVS(o BackendOptions) (Renderer, error) {
	return ipvs.ForRendering(ipvs.Options{Logger: o.Logger, StrictARP: o.StrictARP})
}
