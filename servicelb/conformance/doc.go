//go:build linux

// Package conformance proves a servicelb.Proxier with real packets: one
// table of scenarios (Scenarios), each a shape of Service and what new
// flows from each origin must then do, run against any backend by Run in a
// throwaway topology of network namespaces.
//
// The semantics are servicelb's (see its package documentation): every
// backend must give the same packets the same fate. Each scenario names the
// kube-proxy code whose behaviour it checks; a few check what kproxy adds
// (weights, capabilities, frontend clashes).
//
// # The topology
//
// Run builds a topology of network namespaces: a client outside the
// cluster CIDRs (198.51.100.2, fd00:c::2), the node under test
// (198.51.100.1, fd00:c::1, forwarding, with a default route through the
// client so that its own flows to addresses it does not hold leave as a
// router's do), Endpoints endpoint hosts (10.244.1.2 to 10.244.3.2 and
// their IPv6 twins, all in the cluster CIDRs) and two more hosts in the
// cluster CIDRs that play pods of the node: Pod (10.244.4.2), in the
// node's pod CIDRs (Env.NodeCIDRs) on a node link named PodLink, and
// BridgedPod (10.244.5.2), which the node reaches through the bridge
// PodBridge, so that each local-traffic detection (servicelb.DetectLocal;
// a stage sets it with Stage.Node) recognises one, both or neither. Every
// host serves TCP and UDP (and SCTP, when asked) echo on TargetPort and
// AltTargetPort, and names itself in its answer together with the client
// address it saw, so a check learns which endpoint answered and whether
// the source was masqueraded (the node's address on the endpoint's link)
// or kept.
//
// Each scenario has its own cluster, external and load-balancer IPs and
// node ports (see Env), and syncs its own State over the previous one, so
// that scenarios run one after the other on one proxier, exercising its
// incremental syncs, and no flow of one meets the state of another. A
// check asks from the outside client (Outside, OutsideAt), a pod (Pod,
// BridgedPod), the node (Node) or an endpoint (Endpoint, for hairpin, or
// as a host of the cluster CIDRs that is no pod of the node), to a frontend
// (ClusterIP, NodePort, ExternalIP, LoadBalancerIP, Unallocated; or
// HealthCheckNodePort, which the node itself serves, as an agent serves a
// service's health check beside the proxier), over each family and
// protocol, and expects Reach (with Masqueraded,
// Preserved, Spread, Sticky or Shares), Refused (an ICMP port unreachable,
// for TCP too) or Dropped. Every ask is a new flow: a TCP ask's source port
// is the kernel's, and the UDP and SCTP asks of each host take ports
// 61000-65535 in turn (above the ephemeral ports), so that no ask meets a
// conntrack entry an earlier one left, with an earlier stage's translation.
// A backend under test must not listen there on the hosts that ask.
//
// # Running it on a backend
//
// A backend's test calls Run with a constructor for its proxier in the
// node's namespace:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Backend{
//			Name: "mine",
//			New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier {
//				p, err := mine.New(mine.Options{NetNS: ns})
//				if err != nil {
//					t.Fatal(err)
//				}
//				return p
//			},
//		}, conformance.Options{NotApplicable: []string{
//			"node-port/localhost", // mine serves no node ports on 127.0.0.1
//		}})
//	}
//
// It needs root and a kernel with network namespaces, veth, bridges and
// whatever the backend itself needs; it creates namespaces named "kpt-<pid>-..."
// and removes them, and never touches the caller's namespace.
//
// # Scenarios that do not apply
//
// The backend's Capabilities decide which scenarios apply: a scenario
// that needs a feature the backend does not declare (servicelb.Features),
// or a scheduler hint it does not honour (or, for the scenarios of a
// refused hint or of a bound on endpoints, that the backend honours every
// hint or has no bound), is not applicable and is not run. So is a
// scenario with a stage none of whose checks runs over Options.Protocols,
// such as one that measures a spread over TCP in a run over SCTP alone
// (NoSCTPChecks names those): a stage never passes with nothing checked.
//
// The backend's test declares which scenarios it expects to be left out,
// by name, in Options.NotApplicable, and Run fails when the scenarios
// left out differ: a scenario newly left out (the backend lost a feature
// flag, a check lost its protocol) or one listed that now applies, each
// with why, followed by the list left out now, to copy once the change is
// meant. Scenarios Options.Run does not select do not count. To start,
// run with an empty list and copy the list the failure prints, checking
// each reason against what the backend means to leave out.
//
// The features also say how two kinds of check read: for a backend
// without servicelb.FeaturePreserveSource (a proxy: the endpoint sees the
// node), a check that wants the client's address kept wants the node's;
// for one without servicelb.FeaturePacketVerdicts (a proxy that terminates
// connections), a TCP or SCTP check that wants an ICMP port unreachable
// wants a reset, with no ICMP error and no endpoint answering, and one
// that wants silence accepts such a reset too. Run logs both at the
// start. Options.Protocols adds SCTP where the kernel has it;
// Options.Run selects scenarios by name; the timeouts grow under
// emulation.
//
// A backend that balances at the socket layer (package ebpf) sees the
// flows of the processes in a cgroup, not packets: Backend.Cgroup names
// the cgroup v2 directory its hooks are attached to, and the asks of the
// node and of the pod then come from a process inside it: the test binary
// itself, started again into the cgroup, which becomes the asker when the
// test's TestMain calls Main (in any module: Main is all a backend of
// another module needs besides Run). A socket's error is no packet
// verdict: a check that wants an ICMP port unreachable wants that ICMP
// error, and one that wants silence wants silence, except from the node,
// whose own flow the node drops as it leaves fails its send or connect
// at once (EPERM), under any packet filter's rules.
//
// A proxy that serves its frontends at addresses and ports of its own
// rather than at theirs (the userspace backend without privileges, which
// listens at the node's address and a port per frontend) says where in
// Backend.Redirect: each check then asks there, from the same origin, and
// a frontend it puts nowhere is asked at its own address.
//
// # Every flow explained
//
// Before a check's flows are sent, the state the proxier applied explains
// the flow (servicelb.State.Explain, from the asker's address and, for
// the node's own flows, as the node's; a pod's flow names the interface
// it comes in on). The explanation must predict exactly what the check
// wants: the verdict (forwarded, refused, dropped, or left to the node,
// when no endpoint may answer), the endpoints a
// forwarded flow may reach, the source each sees (masqueraded or kept, a
// hairpin masqueraded), their weights, a client affinity. Every answer the
// packets then bring, in a check of the table or an ask of a custom one
// (Env.Ask), must be one the explanation allows: an endpoint it names,
// seeing the source it says. A flow of a UDP or SCTP session the
// scenario used before is no new flow (it meets its conntrack entry): its
// asks are checked by the table alone. A proxier that gives the kernel's
// word (servicelb.FlowChecker) is asked, for every flow explained, what
// serves it: it must find no difference. A scenario that ran with no flow
// explained fails, so that none is left out of the check.
//
// A failed check names the scenario, the family, protocol, origin and
// frontend, and what happened instead (the endpoint that answered, the
// client address it saw, a reset instead of an ICMP error, an answer
// instead of silence).
package conformance
