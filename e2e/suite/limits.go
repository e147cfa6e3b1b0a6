package suite

import (
	"regexp"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Limit is a test a kproxy backend fails by a limit it declares: in its
// package documentation and in its capabilities (servicelb.Features),
// which tell its users and the conformance kit the same.
type Limit struct {
	// Proxy is the column, such as kproxy-userspace.
	Proxy string
	// Spec matches the test's full text.
	Spec *regexp.Regexp
	// Feature is the capability the backend declares it lacks.
	Feature servicelb.Features
	// Why says what the test needs that the backend does not do, and
	// where the backend's documentation says so.
	Why string
}

// Limits are the declared limits. A test that matches one is not a
// regression: the report says why instead.
var Limits = []Limit{
	{
		Proxy: "kproxy-userspace", Feature: servicelb.FeaturePreserveSource,
		Spec: regexp.MustCompile(`\[sig-network\] Services should (` +
			`support externalTrafficPolicy=Local for type=NodePort|` +
			`implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes|` +
			`preserve source pod IP for traffic thru service cluster IP)`),
		Why: "the userspace backend connects to the endpoint itself: the endpoint sees the node's address, " +
			"never the client's (package userspace; its Capabilities lack FeaturePreserveSource), and the test checks the client's",
	},
	{
		Proxy: "kproxy-userspace", Feature: servicelb.FeaturePreserveSource,
		Spec: regexp.MustCompile(`\[sig-network\] Services should fallback to local terminating endpoints when there are no ready endpoints with externalTrafficPolicy=Local`),
		Why: "the test wants a pod's connection to another node's node port to fail: with externalTrafficPolicy Local and no " +
			"endpoint on that node, kube-proxy forwards a pod's flow to the endpoint on the pod's own node without masquerade, " +
			"whose reply goes straight back to the pod and breaks the connection; the userspace backend connects to the endpoint " +
			"from the node's address (its Capabilities lack FeaturePreserveSource), so the reply comes back through it and the connection succeeds",
	},
	{
		Proxy: "kproxy-userspace", Feature: servicelb.FeatureFreePorts,
		Spec: regexp.MustCompile(`\[sig-network\] DNS HostNetwork should resolve DNS of partial qualified names for services on hostNetwork pods`),
		Why: "the test's host-network pod runs a server on 0.0.0.0:80, and the userspace backend's listeners hold their ports: " +
			"while some cluster IP serves port 80, binding the wildcard address on it fails with EADDRINUSE " +
			"(package userspace, Limits; its Capabilities lack FeatureFreePorts)",
	},
}

// Declared returns the limit of the proxy that covers the test, or nil.
func Declared(proxy, spec string) *Limit {
	for i, l := range Limits {
		if l.Proxy == proxy && l.Spec.MatchString(spec) {
			return &Limits[i]
		}
	}
	return nil
}
