package agent

import (
	"context"
	"errors"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/userspace"
)

// openUserspace opens the userspace backend, which serves each frontend
// from a listener of its own and writes no packet filter rules. By
// default it holds the services' addresses on the namespace's loopback
// (so it needs CAP_NET_ADMIN there, as the other backends do); with
// --userspace-hold-addresses=false it needs no privilege.
func openUserspace(o BackendOptions) (Dataplane, error) {
	uo := userspace.Options{HoldAddresses: true}
	if o.Userspace != nil {
		uo = *o.Userspace
	}
	uo.NetNS, uo.Logger = o.NetNS, o.Logger
	uo.StrictARP = o.StrictARP && uo.HoldAddresses
	return userspace.New(uo)
}

// cleanupUserspace removes the addresses a userspace proxier held (and
// the dummy link it made), whatever the flags of the run: what a proxy
// of another run left is cleaned up all the same.
func cleanupUserspace(ctx context.Context, o BackendOptions) error {
	p, err := userspace.New(userspace.Options{NetNS: o.NetNS, HoldAddresses: true, Logger: o.Logger})
	if err != nil {
		return err
	}
	return errors.Join(p.Cleanup(ctx), p.Close())
}

// unprivileged reports whether the userspace backend runs without
// holding addresses: it needs no privilege, and can clean up no other
// backend's objects.
func unprivileged(o BackendOptions) bool { return o.Userspace != nil && !o.Userspace.HoldAddresses }

// probeUserspace checks nothing: the proxy needs sockets, which every
// kernel has, and no module.
func probeUserspace(netns.NsHandle) error { return nil }
