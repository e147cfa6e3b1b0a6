//go:build privileged

package userspace_test

import (
	"testing"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
	"github.com/kproxy-dev/kproxy/userspace"
)

// TestConformance runs the conformance kit over TCP and UDP (SCTP in the
// VM: conformance_vm_test.go), with the service addresses held on the
// node's loopback. The proxy holds addresses, not the service CIDRs, has
// no bound on endpoints and honours no maglev hint.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformanceBackend(), conformance.Options{NotApplicable: []string{
		"cluster-ip/unallocated-service-address-dropped", "left-out/endpoint-capacity", "scheduler/maglev-spreads-one-clients-connections",
		"node-port/ports-stay-free", "stale-flows/no-serving-endpoint-keeps-its-flows", "stale-flows/deleted-service-keeps-its-flows",
	}})
}

func conformanceBackend() conformance.Backend {
	return conformance.Backend{Name: "userspace", New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier {
		p, err := userspace.New(userspace.Options{NetNS: ns, HoldAddresses: true, StrictARP: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}}
}
