// Package kube feeds kproxy from Kubernetes, as kube-proxy reads it:
// Translate turns a Service and its EndpointSlices into a
// servicelb.Service, and Source follows them with client-go informers
// into a servicelb.Runner's source, together with this node's Node object
// (its addresses, pod CIDRs, zone and eligibility: Node) and the cluster's
// ServiceCIDRs, which a caller applies to the Runner's NodeConfig.
//
// A complete node proxy fed from Kubernetes is a Runner, a backend, a
// Source and what it reports (see the example, and examples/kubeproxy for
// a whole program):
//
//	runner, _ := servicelb.NewRunner(proxier, servicelb.RunnerOptions{Node: node})
//	src := &kube.Source{Client: client, NodeName: kube.NodeName(hostname)}
//	go src.Run(ctx, runner.Source(src.Name()), report)
//	runner.Run(ctx)
//
// Packages beside it read kube-proxy's configuration (kubeproxyconfig)
// and serve kube-proxy's metrics (metrics). The module is apart from the
// core's, so that a consumer of servicelb and its backends never sees a
// k8s.io module.
//
// # Where kube-proxy is not followed
//
//   - A change of the Node's pod CIDRs under detectLocalMode NodeCIDR is
//     followed (OnNode) rather than ending the process, as kube-proxy
//     ends; and a Node without pod CIDRs yet delays the first sync
//     (WaitPodCIDRs) as long as it takes instead of five minutes.
//   - An endpoint of a slice port whose protocol is not the service
//     port's is not an endpoint of it (kube-proxy keys a slice's
//     endpoints by port name and protocol too, so it finds none for the
//     service's port); a slice port without a name or number is left out
//     and reported, as kube-proxy logs it.
package kube
