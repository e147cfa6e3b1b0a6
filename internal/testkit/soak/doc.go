// Package soak is kproxy's chaos soak: a long run of one backend under a
// stream of changes, with traffic flowing, while faults are injected at
// random. It is run by `make soak`, once per backend, and never by `make
// test`: the soak builds only with the tag soak. Its logic that needs
// neither root nor a kernel (the ledger that sorts failures out and
// judges the proxier's growth, the world of services and changes, the
// canonical forms of the kernel's listings) builds without the tag, and
// `make test-unit` runs its tests.
//
//	go test -tags soak -count=1 -timeout 0 -v -run TestSoak ./internal/testkit/soak \
//		-args -soak.backend=nftables -soak.duration=10m
//
// It needs root and a kernel with nf_tables, conntrack, veth and network
// namespaces. Like every test of the module it changes nothing in the
// host's own network namespace: the node, the client and the backends are
// namespaces of internal/testkit/netnstest, removed at the end.
//
// # What runs
//
// A netnstest topology with 20 backend hosts, each serving the short echo
// on port 8080 and a line echo on 8081 (it greets each connection with its
// host name, then echoes every line). 2,000 services (-soak.services),
// each with a cluster IP in 172.16.0.0/12, ports 80 -> 8080 and 81 ->
// 8081, and 10 endpoints (-soak.endpoints) drawn from the backend hosts.
//
// The proxier (a servicelb.Runner with default intervals in front of the
// backend) runs in a child process, the test binary run again, so that it
// can really be killed: it gets the node's network namespace as an
// inherited file, services as JSON lines on its standard input, and
// reports every sync, every Info log record, and its goroutines and heap
// every 2 s as JSON lines on its standard output. The parent reads the
// child's resident set size from /proc itself.
//
// For the whole run, -soak.rate (100) changes a second each replace one
// endpoint of a random service by a backend host it lacks, and the time
// of each removal is kept. While no proxier runs, the changes accumulate
// in the desired state; a new proxier gets the whole state, then the word
// that its source has synced.
//
// Traffic comes from the client: a few goroutines open fresh connections
// to random services' port 80 (-soak.ask-rate a second in all), and 50
// long-lived sessions (-soak.sessions) to random services' port 81 each
// send a line a second and expect it back within 2 s, reconnecting after a
// failure. A session knows the endpoint it reached from the greeting.
//
// # Faults
//
// One fault every 5 to 20 s (uniformly 0.4 to 1.6 times -soak.fault-every),
// at random among those of the backend, drawn from a shuffled deck of
// them so that even a short run meets every kind:
//
//   - flush: nftables `nft flush table inet kproxy`; iptables
//     `iptables-nft -t nat -F`, or (half of the time) the flush of
//     KPROXY-SERVICES or of a KPROXY-SVC- chain.
//   - delete-chain: nftables deletes a service port's chain with the map
//     element that jumps to it; iptables deletes a KPROXY-SVC- chain with
//     its rule in KPROXY-SERVICES (one iptables-nft-restore transaction).
//   - delete-element: nftables deletes an element of one of the table's
//     sets or maps, found by listing the table; iptables, which has no
//     sets, deletes the DNAT rule of an endpoint's KPROXY-SEP- chain.
//   - dormant (nftables only): the table is made dormant. The iptables
//     backend leaves the flags of ip nat alone (the table belongs to every
//     iptables user): neither its syncs nor a new process's first sync
//     clear a dormant flag, so the soak does not make that fault there.
//   - foreign-writer: another program commits to nf_tables in the node ten
//     times a second for 30 s, in a table of its own.
//   - restart: the proxier process is killed with SIGKILL (by its pid) and
//     a new one started 1 to 3 s later, at most once a minute
//     (-soak.restart-every). The new
//     process must adopt the kernel state without breaking traffic.
//
// The first three and dormant are destructive: each opens a window, from
// the fault until the end of the first successful sync after the repair,
// plus 2 s. The repair is seen in the kernel: the soak polls for the
// object the fault took away (a chain's rules, a map element, the table's
// flags). Drift that leaves the table's object counts alone (a flushed
// chain, a deleted element) is found by the backends' deep verify, which
// runs at most every VerifyInterval (a minute by default,
// -soak.verify-interval) while changes keep coming, so such windows last
// up to about a minute; the report shows how long. A fault not repaired
// within 3 minutes fails the soak.
//
// # Accounting and verdict
//
// Two kinds of failure are excused, and no other: a failed ask, session
// check or session connect whose time span meets the window of a fault
// the soak injected (a window closes at the latest when an unrepaired
// fault's would, 3 minutes and 2 s after the fault), and a session check
// outside every window whose endpoint left its service within 5 s
// before. Every other failure is real, and one fails the soak. So do: a
// fault never repaired, a proxier that exits unless killed, a service the
// Runner refuses, a final kernel state other than a fresh apply's, and
// growth beyond the limits: a slope of the longest-lived proxier's
// resident set size above 64 MiB an hour (-soak.max-rss-growth), or of
// its goroutines above 60 an hour (-soak.max-goroutine-growth), over its
// samples after its first minute when they span 5 minutes or more (over
// less, the slopes follow the garbage collector more than any leak, and
// are shown but not judged). The slope is the median of the slopes
// between every two samples (Theil-Sen), which a one-time step, such as
// the resident set growing to the peak of a whole write and staying
// there, does not move, and a steady growth does. With a restart about
// every minute and a half, no process lives long enough to be judged:
// space the restarts out (-soak.restart-every=30m) for a run that judges
// growth.
//
// At the end faults and changes stop, the proxier syncs the final state
// (the Runner has nothing pending and its last sync succeeded), and after
// 3 s more the kernel state is compared with a fresh proxier's apply of
// the same state in a new namespace: for nftables the table from `nft -j`
// (netnstest's CanonicalTable), for iptables iptables-nft-save and
// ip6tables-nft-save with chain declarations sorted and rules grouped by
// chain in order.
//
// The report gives: the backend, duration, services x endpoints, changes
// sent; syncs (attempts, successes, the share that succeeded and the
// share that succeeded at the first attempt, the Runner retrying a failed
// one; how many wrote the whole state; the network programming latency);
// asks and session checks with their failures (in fault windows, excused,
// real); faults by kind with count, failures, longest repair and longest
// outage (from the fault to its last failure); proxier restarts; the
// first and last resident set size, live heap and goroutine count of the
// longest-lived proxier process, their slopes (per hour, over its
// samples after its first 60 s) and whether they are within the limits; whether the final state equals a fresh apply; then the excused
// failures, listed apart by why each is excused (with the fault whose
// window it fell in), and the real ones. docs/soak.md tells how to read
// it.
package soak
