//go:build linux

// Package rtnl speaks route netlink for the backends that hold service
// addresses on a link of their own (ipvs, userspace) and for nodeaddr,
// which follows the node's addresses: one socket in a network namespace,
// and on it
//
//   - links: one looked up by name (its index, kind, flags and alias), all
//     of them listed, a dummy link created with an owner's mark and
//     deleted only by that owner (EnsureDummy, RemoveDummy), a link set
//     up;
//   - addresses: a link's addresses, or every link's, listed with their
//     prefix length, link and protocol mark (IFA_PROTO, which `ip address`
//     shows as "proto"), and added or deleted in batches of messages sent
//     together, each add optionally marked, so that a backend tells its
//     own addresses from anyone else's after a restart; WaitLocal waits
//     for new IPv6 addresses to be routed to the node; AddrEvents tells
//     of every address added or deleted (the kernel's notifications);
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
// # Requests
//
// The package owns route netlink's encoding: the requests and the
// kernel's answers for links, addresses and routes. It sends them through
// internal/nl, the machinery the IPVS requests go through too: a
// ChangeAddrs of many addresses is one batch, many requests to a system
// call, with each request's own error; reads are dumps and lookups, and a
// dump a concurrent change interrupted is read again (a few times).
// Every call takes a context, and returns once the kernel answered or the
// context ended. A Conn is safe for concurrent use; its calls run one at
// a time. Changing links and addresses needs CAP_NET_ADMIN in the
// namespace; reading them needs nothing.
package rtnl
