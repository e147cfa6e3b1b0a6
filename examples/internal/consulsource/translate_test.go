package consulsource

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/consul/api"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func entry(id, addr string, port int, meta map[string]string, status ...string) *api.ServiceEntry {
	e := &api.ServiceEntry{
		Node:    &api.Node{Node: "n1", Address: "10.0.0.100"},
		Service: &api.AgentService{ID: id, Service: "web", Address: addr, Port: port, Meta: meta},
	}
	for i, st := range status {
		e.Checks = append(e.Checks, &api.HealthCheck{CheckID: id + string(rune('a'+i)), Status: st})
	}
	return e
}

var vipMeta = map[string]string{MetaVIP: "10.96.0.20", MetaPort: "80"}

func ep(addr string, port uint16, ready bool) servicelb.Endpoint {
	e := servicelb.Endpoint{Addr: netip.MustParseAddr(addr), Ports: map[string]uint16{"": port}, NodeName: "n1"}
	if !ready {
		e.Ready = new(false)
	}
	return e
}

func TestTranslate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []*api.ServiceEntry
		opts    Options
		want    servicelb.Service
	}{{
		name: "meta, health states",
		entries: []*api.ServiceEntry{
			entry("a", "10.1.0.1", 8080, vipMeta, api.HealthPassing),
			entry("b", "10.1.0.2", 8080, vipMeta, api.HealthPassing, api.HealthCritical),
			entry("c", "10.1.0.3", 8080, vipMeta, api.HealthWarning),
			entry("d", "", 8080, vipMeta),
		},
		want: servicelb.Service{
			Name: "consul/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")},
			Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}},
			Endpoints: []servicelb.Endpoint{ep("10.1.0.1", 8080, true), ep("10.1.0.2", 8080, false),
				ep("10.1.0.3", 8080, false), ep("10.0.0.100", 8080, true)},
		},
	}, {
		name: "mapping wins, warning ready, port from instances",
		entries: []*api.ServiceEntry{
			entry("a", "10.1.0.1", 53, vipMeta, api.HealthWarning),
		},
		opts: Options{WarningReady: true, Mapping: map[string]Mapping{"web": {VIP: "10.96.0.53", Protocol: "UDP", NodePort: 30053}}},
		want: servicelb.Service{
			Name: "consul/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.53")},
			Ports:     []servicelb.Port{{Protocol: servicelb.UDP, Port: 53, NodePort: 30053}},
			Endpoints: []servicelb.Endpoint{ep("10.1.0.1", 53, true)},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Translate("web", tc.entries, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestTranslateErrors(t *testing.T) {
	other := map[string]string{MetaVIP: "10.96.0.21", MetaPort: "80"}
	for _, tc := range []struct {
		name    string
		entries []*api.ServiceEntry
		noVIP   bool
		want    string
	}{
		{"no vip", []*api.ServiceEntry{entry("a", "10.1.0.1", 80, nil)}, true, "no VIP"},
		{"bad vip", []*api.ServiceEntry{entry("a", "10.1.0.1", 80, map[string]string{MetaVIP: "ten"})}, false, `vip "ten"`},
		{"bad port meta", []*api.ServiceEntry{entry("a", "10.1.0.1", 80, map[string]string{MetaVIP: "10.96.0.1", MetaPort: "http"})}, false, "meta kproxy-port"},
		{"disagree", []*api.ServiceEntry{entry("a", "10.1.0.1", 80, vipMeta), entry("b", "10.1.0.2", 80, other)}, false, "disagree"},
		{"ports differ", []*api.ServiceEntry{entry("a", "10.1.0.1", 80, map[string]string{MetaVIP: "10.96.0.1"}), entry("b", "10.1.0.2", 81, nil)}, false, "not one port"},
		{"bad address", []*api.ServiceEntry{entry("a", "host.example", 80, vipMeta)}, false, `address "host.example"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Translate("web", tc.entries, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
			if errors.Is(err, ErrNoVIP) != tc.noVIP {
				t.Errorf("errors.Is(err, ErrNoVIP) = %v", !tc.noVIP)
			}
		})
	}
}

func TestLoadMapping(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("services:\n  web: {vip: 10.96.0.20, port: 80}\n"), 0o644)
	m, err := LoadMapping(good)
	if err != nil || m["web"] != (Mapping{VIP: "10.96.0.20", Port: 80}) {
		t.Fatalf("LoadMapping = %v, %v", m, err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("services:\n  web: {vip: 10.96.0.20, prot: 80}\n"), 0o644)
	if _, err := LoadMapping(bad); err == nil || !strings.Contains(err.Error(), "line 2: field prot not found") {
		t.Errorf("LoadMapping(bad) = %v, want the line and field", err)
	}
}

func TestNextIndex(t *testing.T) {
	for _, tc := range []struct{ prev, last, want uint64 }{{0, 5, 5}, {5, 7, 7}, {7, 3, 0}, {7, 0, 0}, {7, 7, 7}} {
		if got := nextIndex(tc.prev, tc.last); got != tc.want {
			t.Errorf("nextIndex(%d, %d) = %d, want %d", tc.prev, tc.last, got, tc.want)
		}
	}
}
