//go:build vm

package userspace_test

import (
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
	"github.com/kproxy-dev/kproxy/userspace"
)

// TestConformanceSCTP runs the conformance kit over SCTP, which this
// host's kernel lacks and the VM's has (TCP and UDP run on the host:
// conformance_privileged_test.go), with the service addresses held on a
// dummy link of the proxy's.
func TestConformanceSCTP(t *testing.T) {
	conformance.Run(t, conformance.Backend{Name: "userspace", New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier {
		p, err := userspace.New(userspace.Options{NetNS: ns, HoldAddresses: true, StrictARP: true, Link: "kproxy-us0"})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}}, conformance.Options{Protocols: []servicelb.Protocol{servicelb.SCTP}, DropTimeout: time.Second, AskTimeout: 5 * time.Second,
		NotApplicable: append(conformance.NoSCTPChecks(), "cluster-ip/unallocated-service-address-dropped", "left-out/endpoint-capacity",
			"node-port/ports-stay-free")})
}
