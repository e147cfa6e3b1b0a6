//go:build vm

package ebpf_test

import (
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
)

// TestConformanceVM runs the conformance kit on the pairing with nftables
// on the VM's kernel (Debian's 6.1: no tcx, which the socket hooks do not
// need): over TCP and UDP, then over SCTP, which the hooks leave to
// nftables (this host's kernel has none), each with the scenarios it
// leaves out. The timeouts allow for emulation.
func TestConformanceVM(t *testing.T) {
	e := newEnv(t)
	backend := conformance.Backend{Name: "ebpf+nftables", Cgroup: e.Cgroup,
		New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier { return newSocketLB(t, e, ns, true) },
	}
	leftOut := []string{"node-port/localhost", "scheduler/maglev-spreads-one-clients-connections",
		"stale-flows/no-serving-endpoint-keeps-its-flows", "stale-flows/deleted-service-keeps-its-flows"}
	for _, run := range []struct {
		protos []servicelb.Protocol
		left   []string
	}{
		{[]servicelb.Protocol{servicelb.TCP, servicelb.UDP}, leftOut},
		{[]servicelb.Protocol{servicelb.SCTP}, append(conformance.NoSCTPChecks(), "node-port/localhost")},
	} {
		t.Run(string(run.protos[0]), func(t *testing.T) {
			conformance.Run(t, backend, conformance.Options{Protocols: run.protos, DropTimeout: 3 * time.Second, AskTimeout: 10 * time.Second,
				NotApplicable: run.left})
		})
	}
}
