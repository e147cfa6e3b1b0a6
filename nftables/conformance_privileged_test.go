//go:build privileged

package nftables_test

import (
	"testing"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
)

// TestConformance runs the conformance kit over TCP and UDP (SCTP in the
// VM: conformance_vm_test.go). The table serves no node ports on
// localhost and honours no maglev hint.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformanceBackend(), conformance.Options{NotApplicable: []string{
		"node-port/localhost", "scheduler/maglev-spreads-one-clients-connections",
	}})
}

func conformanceBackend() conformance.Backend {
	return conformance.Backend{Name: "nftables", New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier {
		p, err := nftables.New(nftables.Options{NetNS: ns})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}}
}
