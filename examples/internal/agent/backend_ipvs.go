package agent

import (
	"github.com/kproxy-dev/kproxy/ipvs"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func openIPVS(o BackendOptions) (Dataplane, error) {
	return ipvs.New(ipvs.Options{NetNS: o.NetNS, Logger: o.Logger})
}

// renderIPVS renders without the kernel: IPVS may be missing where a dry
// run is made.
func renderIPVS(BackendOptions) (servicelb.Renderer, error) {
	return rendererFunc(func(st *servicelb.State) (string, error) { return ipvs.Render(st, ipvs.Options{}) }), nil
}

type rendererFunc func(*servicelb.State) (string, error)

func (f rendererFunc) Render(st *servicelb.State) (string, error) { return f(st) }
