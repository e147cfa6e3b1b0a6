//go:build linux

// Package rtnl speaks route netlink for the backends that hold service
// addresses on a link of their own (ipvs, userspace): one socket in the
// backend's network namespace, and on it
//
//   - links: one looked up by name (its index, kind, flags and alias), a
//     dummy link created with an owner's mark and deleted only by that
//     owner (EnsureDummy, RemoveDummy), a link set up;
//   - addresses: a link's addresses listed with their prefix length and
//     protocol mark (IFA_PROTO, which `ip address` shows as "proto"), and
//     added or deleted in batches of messages sent together, each add
//     optionally marked, so that a backend tells its own addresses from
//     anyone else's after a restart; WaitLocal waits for new IPv6
//     addresses to be routed to the node;
//   - routes: the interface the namespace routes an address through.
//
// # Ownership of the link
//
// A dummy link the package creates carries its owner's mark as its alias
// (IFLA_IFALIAS, which `ip link` shows as "alias"): RemoveDummy deletes a
// link only when it carries the owner's mark, so that a link of that name
// someone else made (an administrator's, or one another program created
// for its own use) survives the backend's Cleanup, which then removes only
// the addresses the backend put there. The mark lives in the kernel, so a
// restarted process (or `kproxy --cleanup`) knows the link as its own
// without memory of its creation.
//
// Every call sends its messages and reads the kernel's answers before it
// returns; the kernel answers at once, and the socket's receive timeout
// (10 s) only guards against a kernel bug. A Conn is not safe for
// concurrent use. Changing links and addresses needs CAP_NET_ADMIN in the
// namespace; reading them needs nothing.
package rtnl
