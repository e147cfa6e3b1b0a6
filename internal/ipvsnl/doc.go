//go:build linux

// Package ipvsnl speaks IPVS's generic netlink family: it writes virtual
// servers (services) and real servers (destinations) in batches, many
// requests to a system call (internal/nl), and reads them back. It
// is the ipvs backend's access to IPVS, in place of a request, a system
// call and a read of its acknowledgement per object.
//
// # Model
//
// A Service is a virtual server as IPVS holds it: an address family and
// either a protocol, address and port or a firewall mark, with its
// scheduler, flags, persistence timeout and netmask. A Dest is one of its
// real servers: address, port, forwarding method, weight and connection
// thresholds, and, as read back, its connection counts. Addresses are
// netip values.
//
// Conn.Batch returns a Batch bound to the family's identifier; its
// methods (NewService, SetService, DelService, NewDest, SetDest, DelDest)
// encode one request each and never fail. The attributes are those
// ipvsadm (libipvs) sends: a service request carries the whole service
// (IPVS_SVC_ATTR_AF, PROTOCOL, ADDR, PORT or FWMARK, SCHED_NAME, FLAGS
// with a full mask, TIMEOUT, NETMASK); a real server request carries the
// service's key attributes, which are all the kernel reads of it then, and
// the real server (ADDR, PORT, FWD_METHOD, WEIGHT, U_THRESH, L_THRESH,
// ADDR_FAMILY). Conn.Send writes the batch and returns each request's
// error: the kernel handles every request of a datagram, so a failed one
// does not stop the next; a caller that needs order across a failure
// sends the dependent requests in a later batch.
//
// # Reading
//
// Conn.Services dumps every virtual server of the namespace,
// Conn.Dests the real servers of one, and Conn.Service looks one up by
// its key.
//
// # Privileges
//
// CAP_NET_ADMIN in the namespace for every request (IPVS's commands are
// GENL_ADMIN_PERM, reads included), CAP_SYS_ADMIN to open a Conn in
// another namespace. Open fails with ErrNotAvailable when the kernel has
// no IPVS family (the ip_vs module is not loaded); it loads no module.
package ipvsnl
