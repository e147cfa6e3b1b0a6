package agent

import (
	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/userspace"
)

// openUserspace opens the userspace backend, which serves each frontend
// from a listener of its own: it holds the services' addresses on the
// namespace's loopback (so it needs CAP_NET_ADMIN there, as the other
// backends do) and writes no packet filter rules.
func openUserspace(o BackendOptions) (Dataplane, error) {
	return userspace.New(userspace.Options{NetNS: o.NetNS, HoldAddresses: true, Logger: o.Logger})
}

// probeUserspace checks nothing: the proxy needs sockets, which every
// kernel has, and no module.
func probeUserspace(netns.NsHandle) error { return nil }
