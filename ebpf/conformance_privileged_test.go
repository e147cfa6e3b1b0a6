//go:build privileged

package ebpf_test

import (
	"testing"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
)

// TestConformance runs the conformance kit on the pairing of the socket
// hooks with the nftables backend: the node's and the pod's asks come
// from a process in the hooks' cgroup. The pair serves what nftables
// serves: no node ports on localhost, no maglev hint; and the hooks
// translate each new socket afresh, so a flow does not outlive its
// service's serving endpoints.
func TestConformance(t *testing.T) {
	e := newEnv(t)
	conformance.Run(t, conformance.Backend{Name: "ebpf+nftables", Cgroup: e.Cgroup,
		New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier { return newSocketLB(t, e, ns, true) },
	}, conformance.Options{NotApplicable: []string{"node-port/localhost", "scheduler/maglev-spreads-one-clients-connections",
		"stale-flows/no-serving-endpoint-keeps-its-flows", "stale-flows/deleted-service-keeps-its-flows"}})
}
