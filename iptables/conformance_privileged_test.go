//go:build privileged

package iptables_test

import (
	"testing"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
)

// TestConformance runs the conformance kit over TCP and UDP (SCTP in the
// VM: conformance_vm_test.go). The rules have no bound on endpoints and
// honour no maglev hint.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformanceBackend(), conformance.Options{NotApplicable: []string{
		"left-out/endpoint-capacity", "scheduler/maglev-spreads-one-clients-connections",
	}})
}

func conformanceBackend() conformance.Backend {
	return conformance.Backend{Name: "iptables", New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier {
		p, err := iptables.New(iptables.Options{NetNS: ns})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}}
}
