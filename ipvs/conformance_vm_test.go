//go:build vm

package ipvs

import (
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
)

// TestConformance runs the conformance kit over TCP, UDP and SCTP. IPVS
// keeps a pin while its connections live (no affinity expiry), has no
// bound on endpoints and serves no node ports on localhost.
func TestConformance(t *testing.T) {
	netnstest.Require(t, vmFeatures...)
	conformance.Run(t, conformance.Backend{Name: "ipvs", New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier {
		p, err := New(Options{NetNS: ns, StrictARP: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}}, conformance.Options{
		Protocols:   []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP},
		DropTimeout: time.Second, AskTimeout: 5 * time.Second,
		NotApplicable: []string{"affinity/lasts-while-renewed-then-expires", "left-out/endpoint-capacity", "node-port/localhost",
			"stale-flows/no-serving-endpoint-keeps-its-flows", "stale-flows/deleted-service-keeps-its-flows"},
	})
}
