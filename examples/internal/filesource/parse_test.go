package filesource

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func TestParseYAMLAndJSON(t *testing.T) {
	yamlDoc := `
services:
  - name: ns/a
    clusterIPs: [10.96.0.1]
    ports:
      - {name: http, port: 80, targetPort: 8080, nodePort: 30080}
      - {name: dns, protocol: UDP, port: 53}
    affinity: {clientIP: true, timeout: 10m}
    externalTrafficPolicy: Local
    sourceRanges: [192.0.2.0/24]
    endpoints:
      - addr: 10.1.0.1
        ports: {http: 9090}
        nodeName: n1
        zone: z1
        hints: {forZones: [z1]}
      - {addr: 10.1.0.2, ready: false, serving: true, terminating: true, weight: 0}
`
	jsonDoc := `{
	"services": [{
		"name": "ns/a", "clusterIPs": ["10.96.0.1"],
		"ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080},
		          {"name": "dns", "protocol": "UDP", "port": 53}],
		"affinity": {"clientIP": true, "timeout": "10m"},
		"externalTrafficPolicy": "Local",
		"sourceRanges": ["192.0.2.0/24"],
		"endpoints": [
			{"addr": "10.1.0.1", "ports": {"http": 9090}, "nodeName": "n1", "zone": "z1", "hints": {"forZones": ["z1"]}},
			{"addr": "10.1.0.2", "ready": false, "serving": true, "terminating": true, "weight": 0}
		]
	}]
}`
	want := []servicelb.Service{{
		Name:       "ns/a",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Ports: []servicelb.Port{
			{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080}, // "" is TCP, as in Go
			{Name: "dns", Protocol: servicelb.UDP, Port: 53},
		},
		Affinity:              servicelb.SessionAffinity{ClientIP: true, Timeout: 600e9},
		ExternalTrafficPolicy: servicelb.PolicyLocal,
		SourceRanges:          []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		Endpoints: []servicelb.Endpoint{
			{Addr: netip.MustParseAddr("10.1.0.1"), Ports: map[string]uint16{"http": 9090},
				NodeName: "n1", Zone: "z1", Hints: servicelb.Hints{ForZones: []string{"z1"}}},
			{Addr: netip.MustParseAddr("10.1.0.2"), Ready: new(false), Serving: new(true), Terminating: true, Weight: servicelb.Weight(0)},
		},
	}}
	for name, doc := range map[string]string{"yaml": yamlDoc, "json": jsonDoc} {
		t.Run(name, func(t *testing.T) {
			p, err := Parse("f", []byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Bad) > 0 {
				t.Fatalf("bad services: %v", p.Bad)
			}
			if diff := cmp.Diff(want, p.Services, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
				cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("services (-want +got):\n%s", diff)
			}
		})
	}
}

// Whole-file mistakes fail the file, with the line.
func TestParseFileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"syntax", "services:\n  - name: a\n    ports: [\n", "svc.yaml:3: did not find expected node content"},
		{"unknown field", "services:\n  - name: a\n    bogus: 1\n", `svc.yaml:3: services[0].bogus: unknown field "bogus"`},
		{"misspelt field", "services:\n  - name: a\n    ports: [{port: 80, targetport: 8080}]\n",
			`svc.yaml:3: services[0].ports[0].targetport: unknown field "targetport" (did you mean "targetPort"?)`},
		{"wrong type", "services:\n  - name: a\n    ports:\n      - port: eighty\n",
			`svc.yaml:4: services[0].ports[0].port: want an integer from 0 to 65535, got "eighty"`},
		{"out of range", "services:\n  - name: a\n    ports:\n      - port: 70000\n",
			`svc.yaml:4: services[0].ports[0].port: want an integer from 0 to 65535, got 70000`},
		{"duration as a number", "services:\n  - name: a\n    affinity: {timeout: 3600}\n",
			`svc.yaml:3: services[0].affinity.timeout: want a duration such as "3h", got "3600"`},
		{"number for a name", "services:\n  - name: 42\n", `svc.yaml:2: services[0].name: want a string (quote a value that looks like a number), got "42"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("svc.yaml", []byte(tc.doc))
			if err == nil {
				t.Fatal("no error")
			}
			var pr *Problem
			if !errors.As(err, &pr) {
				t.Errorf("error %v is not a *Problem", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestParseEmpty(t *testing.T) {
	p, err := Parse("f", nil)
	if err != nil || len(p.Services) != 0 {
		t.Fatalf("Parse(empty) = %v, %v", p, err)
	}
}

// A service whose address does not parse is left out with its line and
// field; the others stay.
func TestParseBadService(t *testing.T) {
	doc := `services:
  - name: good
    ports: [{port: 80}]
  - name: bad
    ports: [{port: 80}]
    endpoints:
      - addr: 10.0.0.1
      - addr: 10.0.0.x
  - name: good
    ports: [{port: 81}]
  - name: slow
    ports: [{port: 82}]
    affinity: {clientIP: true, timeout: soon}
`
	p, err := Parse("s.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Services) != 1 || p.Services[0].Name != "good" {
		t.Errorf("services %v, want only the first good", p.Services)
	}
	for name, want := range map[string]string{
		"bad":  `s.yaml:8: service "bad": endpoints[1].addr: ParseAddr("10.0.0.x")`,
		"good": `s.yaml:9: service "good": name: duplicate service name, also services[0]`,
		"slow": `s.yaml:13: service "slow": affinity.timeout: time: invalid duration "soon"`,
	} {
		if err := p.Bad[name]; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Bad[%q] = %v, want %q", name, err, want)
		}
	}
}

// servicelb's validation errors are placed on the line of their field.
func TestLocate(t *testing.T) {
	doc := `services:
  - name: web
    clusterIPs: [10.96.0.1]
    ports:
      - name: http
        port: 80
        nodePort: 80
    endpoints:
      - addr: 10.0.0.1
        ports:
          http: 0
`
	p, err := Parse("s.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	node := servicelb.NodeConfig{NodePortRange: servicelb.PortRange{Min: 30000, Max: 32767}}
	verr := servicelb.Validate(&node, &p.Services[0])
	if verr == nil {
		t.Fatal("no validation error")
	}
	got := p.Locate(verr).Error()
	for _, want := range []string{
		`s.yaml:7: service "web": ports[0].nodePort: 80: node port outside the node port range`,
		`s.yaml:11: service "web": endpoints[0].ports["http"]: 0: invalid port`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Locate: %s\nwant a line %q", got, want)
		}
	}
	if !errors.Is(p.Locate(verr), servicelb.ErrNodePortRange) {
		t.Error("located error does not match servicelb.ErrNodePortRange")
	}
}

func TestSplitPath(t *testing.T) {
	got := splitPath(`services[2].endpoints[0].ports["http"]`)
	want := []segment{{"services", -1}, {index: 2}, {"endpoints", -1}, {index: 0}, {"ports", -1}, {"http", -1}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(segment{})); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestGoEncodingReadsBack: the file format is servicelb's JSON encoding.
// json.Marshal of services made with the Go API, their zero values left
// as they are, reads back as the same services, and so do the services
// of a State built from them (their defaults filled in); a zero protocol
// is left out, not written as "". Go's zero endpoint and a file's
// endpoint without conditions are both ready.
func TestGoEncodingReadsBack(t *testing.T) {
	addr := netip.MustParseAddr
	services := []servicelb.Service{
		{
			Name: "ns/web", ClusterIPs: []netip.Addr{addr("10.96.0.10"), addr("fd00:96::10")},
			Ports: []servicelb.Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080},
				{Name: "dns", Protocol: servicelb.UDP, Port: 53}},
			ExternalIPs: []netip.Addr{addr("192.0.2.10")}, ExternalTrafficPolicy: servicelb.PolicyLocal,
			Affinity:     servicelb.SessionAffinity{ClientIP: true, Timeout: 90 * 60e9},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, HealthCheckNodePort: 31000,
			Endpoints: []servicelb.Endpoint{
				{Addr: addr("10.1.0.1"), Ports: map[string]uint16{"http": 9090}, NodeName: "n1", Zone: "z1",
					Hints: servicelb.Hints{ForZones: []string{"z1"}}},
				{Addr: addr("10.1.0.2"), Ready: new(false), Serving: new(true), Terminating: true, Weight: servicelb.Weight(0)},
				{Addr: addr("10.1.0.3"), Ready: new(false), OnlyNamedPorts: true, Ports: map[string]uint16{"dns": 5353}},
			},
		},
		{Name: "ns/bare", ClusterIPs: []netip.Addr{addr("10.96.0.11")}, Ports: []servicelb.Port{{Port: 443}},
			Endpoints: []servicelb.Endpoint{{Addr: addr("10.1.0.4")}}},
	}
	addrs := cmp.Options{cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}
	readBack := func(t *testing.T, svcs []servicelb.Service) []servicelb.Service {
		t.Helper()
		b, err := json.Marshal(File{Services: svcs})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `"protocol":""`) {
			t.Errorf("an empty protocol is written: %s", b)
		}
		p, err := Parse("services.json", b)
		if err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		if len(p.Bad) > 0 {
			t.Fatalf("services left out: %v\n%s", p.Bad, b)
		}
		return p.Services
	}

	t.Run("services", func(t *testing.T) {
		if diff := cmp.Diff(services, readBack(t, services), addrs); diff != "" {
			t.Errorf("read back (-want +got):\n%s", diff)
		}
	})
	t.Run("state", func(t *testing.T) {
		st, err := servicelb.NewState(servicelb.NodeConfig{NodeName: "n1"}, services...)
		if err != nil {
			t.Fatal(err)
		}
		var applied []servicelb.Service
		for _, s := range st.Services() {
			applied = append(applied, *s)
		}
		got := readBack(t, applied)
		if diff := cmp.Diff(applied, got, addrs); diff != "" {
			t.Errorf("read back (-want +got):\n%s", diff)
		}
		again, err := servicelb.NewState(servicelb.NodeConfig{NodeName: "n1"}, got...)
		if err != nil {
			t.Fatal(err)
		}
		if ch := servicelb.Diff(st, again); !ch.Empty() {
			t.Errorf("the state read back differs: %+v", ch)
		}
		// The zero endpoint of ns/bare serves, as the file's would.
		sp := again.ServicePorts("ns/bare")
		if len(sp) != 1 || len(sp[0].Cluster) != 1 {
			t.Fatalf("ns/bare's endpoint does not serve: %+v", sp)
		}
	})
}
