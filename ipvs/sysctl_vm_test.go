//go:build vm

package ipvs

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// sysctl reads a sysctl in host h's namespace.
func readSysctl(t *testing.T, h *netnstest.Host, path string) string {
	t.Helper()
	return strings.TrimSpace(h.Exec(t, "cat", "/proc/sys/"+path))
}

// TestSysctls checks that the first Sync sets the IPVS sysctls in the
// target namespace (and the ARP ones only with StrictARP), and that with
// LeaveSysctls it refuses to run with them unset, changing nothing.
func TestSysctls(t *testing.T) {
	for _, strict := range []bool{false, true} {
		e := newEnv(t, 1, Options{StrictARP: strict})
		e.sync(e.state(longService(0)))
		want := map[string]string{
			"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
			"net/ipv4/vs/expire_quiescent_template": "1",
			"net/ipv4/conf/all/arp_ignore":          "0", "net/ipv4/conf/all/arp_announce": "0",
		}
		if strict {
			want["net/ipv4/conf/all/arp_ignore"], want["net/ipv4/conf/all/arp_announce"] = "1", "2"
		}
		for path, v := range want {
			if got := readSysctl(t, e.tp.Node, path); got != v {
				t.Errorf("StrictARP %v: %s = %s, want %s", strict, path, got, v)
			}
		}
	}
	h := netnstest.NewHost(t, "leave")
	p, err := New(Options{NetNS: h.NS, LeaveSysctls: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	st := mustState(t, servicelb.NodeConfig{}, longService(0))
	if err := servicetest.SyncErr(p.Sync(t.Context(), st)); !errors.Is(err, ErrSysctl) {
		t.Fatalf("Sync with LeaveSysctls and the sysctls unset: %v, want ErrSysctl", err)
	}
	if got := readSysctl(t, h, "net/ipv4/vs/conntrack"); got != "0" {
		t.Errorf("LeaveSysctls: net.ipv4.vs.conntrack = %s, want it left at 0", got)
	}
	if out := h.Exec(t, "ipvsadm", "-Sn"); out != "" {
		t.Errorf("a refused Sync created virtual servers:\n%s", out)
	}
}

// TestStrictARP checks the point of StrictARP: a host on the node's link
// that asks by ARP for a virtual address (as a router of a layer 2 load
// balancer would) gets an answer without it and none with it.
func TestStrictARP(t *testing.T) {
	for _, strict := range []bool{false, true} {
		e := newEnv(t, 1, Options{StrictARP: strict})
		e.serve("tcp", 8080, 0)
		svc := localService(servicelb.PolicyCluster, servicelb.PolicyCluster, true)
		svc.Endpoints = endpoints(0)
		e.sync(e.state(svc))
		lb := a("203.0.113.150")
		// The client reaches the address on its link, by ARP, not through
		// its gateway.
		e.tp.Client.Exec(t, "ip", "route", "add", netip.PrefixFrom(lb, 32).String(), "dev", netnstest.HostLink)
		_, err := e.tp.Client.Ask(t.Context(), "tcp", ap(lb, 80))
		if strict && err == nil {
			t.Errorf("StrictARP: the node answered ARP for %s on its client link", lb)
		}
		if !strict && err != nil {
			t.Errorf("without StrictARP: %v", err)
		}
	}
}

// TestCleanupOfNothing checks that Cleanup in a namespace where the proxier
// never ran succeeds and changes nothing, and that a Sync after Cleanup
// builds everything again.
func TestCleanupOfNothing(t *testing.T) {
	e := newEnv(t, 1, Options{})
	before := kernelText(t, e.tp.Node, e.p.opts)
	if err := e.p.Cleanup(t.Context()); err != nil {
		t.Fatalf("Cleanup of nothing: %v", err)
	}
	if after := kernelText(t, e.tp.Node, e.p.opts); !reflect.DeepEqual(before, after) {
		t.Errorf("Cleanup of nothing changed the kernel: %v -> %v", before, after)
	}
	st := e.state(longService(0))
	e.sync(st)
	if err := e.p.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.sync(st)
	e.checkIPVS(st)
}
