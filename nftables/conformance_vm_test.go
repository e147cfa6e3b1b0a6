//go:build vm

package nftables_test

import (
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
)

// TestConformanceSCTP runs the conformance kit over SCTP, which this
// host's kernel lacks and the VM's has (TCP and UDP run on the host:
// conformance_privileged_test.go). The scenarios of TCP or UDP alone
// are left out, as on the host those the table cannot express.
func TestConformanceSCTP(t *testing.T) {
	conformance.Run(t, conformance.Backend{Name: "nftables", New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier {
		p, err := nftables.New(nftables.Options{NetNS: ns})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}}, conformance.Options{Protocols: []servicelb.Protocol{servicelb.SCTP}, DropTimeout: time.Second, AskTimeout: 5 * time.Second,
		NotApplicable: append(conformance.NoSCTPChecks(), "node-port/localhost")})
}
