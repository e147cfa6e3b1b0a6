// Package conntrack lists the kernel's connection tracking table and
// deletes the flows that a change of service endpoints leaves stale, over
// ctnetlink (netlink's NETLINK_NETFILTER conntrack subsystem).
//
// # Why stale flows matter
//
// A proxier translates the first packet of a flow to a service address
// (DNAT) and conntrack applies the same translation to every later packet
// of the flow. For TCP a flow ends with its connection; for UDP and SCTP a
// client that keeps sending keeps its entry alive, and with it the
// translation to a backend that may be gone, or (for a service that had no
// backends) the rejection. servicelb.Changes.StaleFlows lists what to
// delete after a sync, servicelb.State.StaleFlows what to delete to bring
// a whole table in line with a state (after a restart); DeleteStale
// deletes it.
//
// # Model
//
// A Flow is one entry: Orig is the direction the client sent (Orig.Dst is
// the service address before translation), Reply the answers' direction
// (Reply.Src is the backend after DNAT). A servicelb.StaleFlow selects the
// flows of a protocol to one frontend (an original destination address and
// port) whose reply source is not one of the endpoints serving it; see
// Flow.Matches.
//
// # Lifecycle
//
//	c, err := conntrack.New(conntrack.Options{NetNS: ns, Logger: log})
//	defer c.Close()
//	n, err := c.DeleteStale(ctx, changes.StaleFlows())
//
// New opens one netlink socket in the namespace Options.NetNS (zero: the
// namespace of the calling thread) from a thread switched into it, so the
// caller's threads never change namespace; the socket stays in that
// namespace until Close. A Client serialises its calls. Each call honours
// its context: its end, by deadline or cancellation, interrupts a call
// under way.
//
// DeleteStale reads each family's table once per call (a filter's family is
// its destination's), matches each flow against all filters with two map
// lookups and a search of the serving endpoints (an index by protocol and
// port, then destination), and deletes
// each match by its original tuple, zone and conntrack ID, so a new flow
// that reuses the tuple is left alone. A flow that vanished meanwhile
// counts as deleted. When the kernel marks a dump as interrupted by
// concurrent changes (NLM_F_DUMP_INTR), the call deletes what that dump
// showed and dumps again, at most MaxAttempts times, then reports
// ErrDumpInterrupted. Invalid filters fail the call before anything is read
// or deleted (*StaleFlowError). Kernel failures are *OpError values naming
// the operation and family.
//
// The parser reads the ports of every protocol that has them, SCTP
// included. The conntrack API of github.com/vishvananda/netlink reads TCP
// and UDP ports only, so it cannot match SCTP flows by port; that is why
// this package speaks ctnetlink itself, over the project's one netlink
// layer (internal/nl).
//
// # Tuning
//
// Tuning holds kube-proxy's conntrack settings (the table's size per CPU,
// the TCP established and close-wait timeouts, tcp_be_liberal, the UDP
// timeouts). Nothing in kproxy writes them unless asked: Tuning.Apply
// writes those set, in a namespace. The timeouts are each namespace's own;
// the table's size is the kernel's, which only the initial namespace may
// set (ErrNotNamespaced elsewhere).
//
// # What it owns
//
// Nothing: the package creates no kernel objects and has no Cleanup. It
// deletes only flows that the filters given to DeleteStale match, and
// writes only the settings a Tuning sets.
//
// # Privileges
//
// Listing and deleting flows needs CAP_NET_ADMIN in the namespace's user
// namespace; opening a client for another namespace needs CAP_SYS_ADMIN to
// enter it. The kernel must have conntrack netlink (CONFIG_NF_CT_NETLINK).
package conntrack
