// Package ipset manages the kernel's ipset sets and their entries through
// netlink, with a helper that makes a set hold exactly a desired list of
// entries while sending only the difference. kproxy's IPVS dataplane keeps
// kube-proxy's IPVS-mode sets with it (KUBE-CLUSTER-IP hash:ip,port,
// KUBE-LOOP-BACK hash:ip,port,ip, KUBE-NODE-PORT-TCP bitmap:port,
// KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net, ...).
//
// # Model
//
// A Set has a name, a Type (hash:ip, hash:ip,port, hash:ip,port,ip,
// hash:ip,port,net, hash:net, bitmap:port), an address Family (IPv4 or
// IPv6; none for bitmap:port) and options: a default entry Timeout,
// Comment and Counters support, MaxElem and HashSize for hash types, the
// port range of a bitmap:port set. An Entry holds net/netip values; the
// set's type decides which fields it uses (see Entry) and an entry that
// does not fit is rejected with an EntryError before anything is sent.
//
// # Lifecycle
//
//	c, err := ipset.New(ipset.Options{NetNS: ns, Prefix: "KPROXY-"})
//	defer c.Close()
//	err = c.Ensure(ctx, ipset.Set{Name: "CLUSTER-IP", Type: ipset.HashIPPort, Family: ipset.IPv4})
//	res, err := c.Sync(ctx, "CLUSTER-IP", entries) // on every change
//	idx, err := c.Index(ctx, "CLUSTER-IP")         // for an iptables set match
//	err = c.Cleanup(ctx)                           // when the dataplane goes away
//
// Create fails if the set exists; Ensure adopts an identical existing set
// (the kernel compares type, family and options) and refuses one with
// other settings (ErrIncompatible), so a restarted agent keeps its sets and
// their entries. Sync lists the set, adds what is missing (and re-adds
// entries whose comment changed), then deletes what is extra: an entry
// that stays is never removed, even briefly, and its running timeout and
// counters are left alone. Add and Delete send their entries in batches
// (several entries per netlink message). An unchanged Sync sends a single
// list request.
//
// Restore renders a set and its entries as `ipset restore` input, for dry
// runs, logs and golden tests; fed to `ipset restore` it makes the same set
// the client would.
//
// # What it owns
//
// Every set the client creates is named Prefix+Name in the kernel (the
// whole name at most 31 bytes). List returns only sets with the prefix,
// Cleanup destroys only those, and Destroy, Flush and the entry methods
// reach only them, because they always add the prefix: clients with
// different prefixes, and sets created by anyone else, coexist in one
// namespace untouched. Cleanup leaves a set that an iptables rule still
// references and reports ErrInUse for it: remove the rules first.
//
// # Set index
//
// iptables' set match (xt_set) refers to a set by the kernel's index, not
// its name. Index returns it, read from the set's list header, which
// carries it from ipset protocol 7 on (tested on Linux 6.1 and 6.18; with
// an older kernel Index fails with ErrNotSupported). It is per namespace
// and changes when a set is destroyed and created again, so read it after
// Ensure.
//
// # Kernel and privileges
//
// The client speaks the ipset netlink protocol itself (NETLINK_NETFILTER,
// subsystem IPSET) through the project's one netlink layer (internal/nl)
// rather than the ipset API of github.com/vishvananda/netlink, which logs
// through the global log package, cannot set a hash size, picks no type
// revision for hash:net or bitmap:port (so their comments and timeouts
// fail), sends one message per entry and may panic on a non-errno error.
// Set type revisions are asked from the kernel, as the ipset tool does.
// Every call needs CAP_NET_ADMIN in the target namespace; New needs
// CAP_SYS_ADMIN to open its socket in another namespace (Options.NetNS).
// The kernel needs the ip_set module and
// one module per set type (ip_set_hash_ipport, ...); their absence shows as
// ErrNotSupported. Nothing here loads modules or runs the ipset binary.
//
// Errors wrap an OpError naming the operation and the kernel's set name;
// test them with errors.Is against ErrInvalid, ErrNotExist, ErrExist,
// ErrIncompatible, ErrInUse and ErrNotSupported, or errors.As with
// EntryError, SetError and KernelError.
package ipset
