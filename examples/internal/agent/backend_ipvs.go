package agent

import (
	"github.com/kproxy-dev/kproxy/ipvs"
)

// ipvsOptions are the ipvs backend's options for o.
func ipvsOptions(o BackendOptions) ipvs.Options {
	return ipvs.Options{NetNS: o.NetNS, Logger: o.Logger, StrictARP: o.StrictARP}
}

// probeIPVS checks what the ipvs backend needs, changing nothing.
func probeIPVS(o BackendOptions) error { return ipvs.Probe(ipvsOptions(o)) }

func openIPVS(o BackendOptions) (Dataplane, error) { return ipvs.New(ipvsOptions(o)) }

// renderIPVS renders without the kernel: IPVS may be missing where a dry
// run is made.
func renderIPVS(o BackendOptions) (Renderer, error) {
	return ipvs.ForRendering(ipvs.Options{Logger: o.Logger, StrictARP: o.StrictARP})
}
