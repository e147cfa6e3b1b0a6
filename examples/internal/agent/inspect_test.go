package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func inspectState(t *testing.T) *servicelb.State {
	t.Helper()
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	st, err := servicelb.NewState(servicelb.NodeConfig{
		NodeName: "n1", NodeIPs: []netip.Addr{a("192.168.0.10")}, ClusterCIDRs: []netip.Prefix{p("10.244.0.0/16")},
	},
		servicelb.Service{Name: "default/web", ClusterIPs: []netip.Addr{a("10.96.0.10")},
			Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints: []servicelb.Endpoint{{Addr: a("10.244.1.5"), NodeName: "n1"}, {Addr: a("10.244.2.5"), NodeName: "n2"}}},
		servicelb.Service{Name: "default/other", ClusterIPs: []netip.Addr{a("10.96.0.10")},
			Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}}},
	)
	require.NoError(t, err)
	return st
}

// TestInspectEndpoints: /configz, /state and /explain over real HTTP,
// before the first sync and after.
func TestInspectEndpoints(t *testing.T) {
	var st *servicelb.State
	var in inspection
	cfg := Config{Backend: "nftables", ClusterCIDRs: "10.244.0.0/16"}
	srv := httptest.NewServer(inspectHandler(cfg, &in, func() *servicelb.State { return st }, nil))
	defer srv.Close()

	code, body := httpGet(t, srv.URL+"/explain?from=10.244.1.5&to=10.96.0.10:80/tcp")
	assert.Equal(t, http.StatusServiceUnavailable, code, "before the first sync: %s", body)

	st = inspectState(t)
	in.leave("default/bad", "kubernetes", errors.New("ports[0].port: 0 is not a port"))
	in.synced(servicelb.SyncResult{Services: 2})
	in.served(st)

	code, body = httpGet(t, srv.URL+"/configz")
	require.Equal(t, http.StatusOK, code)
	var configz map[string]map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &configz))
	assert.Equal(t, "nftables", configz["kproxy"]["Backend"])

	code, body = httpGet(t, srv.URL+"/state")
	require.Equal(t, http.StatusOK, code)
	var d StateDump
	require.NoError(t, json.Unmarshal([]byte(body), &d))
	assert.Equal(t, "nftables", d.Backend)
	assert.Len(t, d.Services, 2)
	require.Len(t, d.Conflicts, 1)
	assert.Equal(t, st.Conflicts()[0].Winner, d.Conflicts[0].Winner)
	require.Len(t, d.LeftOut, 1)
	assert.Equal(t, "default/bad", d.LeftOut[0].Object)
	require.NotNil(t, d.LastSync)
	text, err := d.Text()
	require.NoError(t, err)
	assert.Contains(t, text, "conflicts:\n  "+st.Conflicts()[0].String())
	assert.Contains(t, text, "default/bad (kubernetes, ")

	code, body = httpGet(t, srv.URL+"/explain?from=10.244.1.5&to=10.96.0.10:80/tcp")
	require.Equal(t, http.StatusOK, code, body)
	assert.Regexp(t, `origin +pod: `, body)
	assert.Contains(t, body, "conflicts")

	code, body = httpGet(t, srv.URL+"/explain?from=10.244.1.5&to=10.96.0.10:80&format=json")
	require.Equal(t, http.StatusOK, code, body)
	var e map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &e))
	assert.Equal(t, "pod", e["origin"])
	assert.Equal(t, true, e["handled"])

	code, body = httpGet(t, srv.URL+"/explain?from=nowhere&to=10.96.0.10:80")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, `from "nowhere"`)
}

// TestExplainCommand: `explain` asks the server, and answers the same
// offline from the state `state --json` dumped.
func TestExplainCommand(t *testing.T) {
	st := inspectState(t)
	var in inspection
	srv := httptest.NewServer(inspectHandler(Config{Backend: "iptables"}, &in, func() *servicelb.State { return st }, nil))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	p := Program{Name: "kproxy"}
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := p.Run(context.Background(), args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	flow := []string{"--from", "198.51.100.7:4000", "--to", "10.96.0.10:80/tcp"}
	code, online, errs := run(append([]string{"explain", "--server", addr}, flow...)...)
	require.Equal(t, 0, code, errs)
	winner := st.Conflicts()[0].Winner
	assert.Regexp(t, `frontend +cluster IP 10\.96\.0\.10:80 of `+regexp.QuoteMeta(winner)+`:`, online)

	code, dump, errs := run("state", "--server", addr, "--json")
	require.Equal(t, 0, code, errs)
	path := filepath.Join(t.TempDir(), "state.json")
	require.NoError(t, os.WriteFile(path, []byte(dump), 0o600))
	code, offline, errs := run(append([]string{"explain", "--state", path}, flow...)...)
	require.Equal(t, 0, code, errs)
	assert.Equal(t, online, offline, "offline, from the dumped state")

	code, asJSON, errs := run(append([]string{"explain", "--state", path, "--json"}, flow...)...)
	require.Equal(t, 0, code, errs)
	var e map[string]any
	require.NoError(t, json.Unmarshal([]byte(asJSON), &e))
	assert.Equal(t, "outside", e["origin"])

	code, text, errs := run("state", "--server", addr)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, text, "backend: iptables")

	code, _, errs = run("explain", "--from", "10.0.0.1")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "a flow needs from")
}

// differingKernel is a backend whose kernel always differs from the
// explanation: a test aid for the answer's form (the binary's test reads
// a real kernel).
type differingKernel struct{ servicelb.Proxier }

func (differingKernel) CheckFlow(context.Context, *servicelb.Explanation) (servicelb.KernelCheck, error) {
	return servicelb.KernelCheck{Backend: "nftables", Read: []string{"table inet kproxy"},
		Differences: []string{"chain services is missing"}}, nil
}

// TestExplainKernelsWord: a backend that reads the kernel back adds its
// word to /explain: a section after the explanation's text, and "kernel"
// after the explanation's fields.
func TestExplainKernelsWord(t *testing.T) {
	st := inspectState(t)
	var in inspection
	srv := httptest.NewServer(inspectHandler(Config{Backend: "nftables"}, &in, func() *servicelb.State { return st }, differingKernel{}))
	defer srv.Close()
	code, body := httpGet(t, srv.URL+"/explain?from=198.51.100.7&to=10.96.0.10:80")
	require.Equal(t, http.StatusOK, code, body)
	assert.Regexp(t, `\nkernel +nftables DIFFERS from the explanation in 1 place\ndiffers +chain services is missing\nread +table inet kproxy\n$`, body)
	code, body = httpGet(t, srv.URL+"/explain?from=198.51.100.7&to=10.96.0.10:80&format=json")
	require.Equal(t, http.StatusOK, code, body)
	var e map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	assert.Equal(t, "outside", e["origin"])
	assert.Equal(t, map[string]any{"backend": "nftables", "read": []any{"table inet kproxy"},
		"differences": []any{"chain services is missing"}}, e["kernel"])
	assert.Regexp(t, `"kernel": \{[^}]*\}\n\}\n$`, body, "kernel comes last")
}

// tracingBackend answers every trace with one step: a test aid for the
// answer's form (the backends' own tests follow real packets).
type tracingBackend struct{ servicelb.Proxier }

func (tracingBackend) Trace(_ context.Context, f servicelb.Flow) (servicelb.Trace, error) {
	if f.Dst.Port() == 9 {
		return servicelb.Trace{}, context.DeadlineExceeded
	}
	return servicelb.Trace{Backend: "nftables", Steps: []servicelb.TraceStep{{Table: "inet kproxy", Chain: "services",
		Rule: "ip daddr . meta l4proto . th dport vmap @services4", Verdict: "goto svc4-" + f.Dst.String()}}}, nil
}

// TestTraceEndpoint: /trace and `trace` follow a packet on a backend
// that traces, say which backends do on one that does not, and refuse a
// timeout out of bounds.
func TestTraceEndpoint(t *testing.T) {
	st := inspectState(t)
	var in inspection
	srv := httptest.NewServer(inspectHandler(Config{Backend: "nftables"}, &in, func() *servicelb.State { return st }, tracingBackend{}))
	defer srv.Close()
	code, body := httpGet(t, srv.URL+"/trace?from=198.51.100.7&to=10.96.0.10:80&timeout=2s")
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "trace       nftables, 1 step\n"+
		"            inet kproxy services: ip daddr . meta l4proto . th dport vmap @services4 -> goto svc4-10.96.0.10:80\n", body)
	code, body = httpGet(t, srv.URL+"/trace?from=198.51.100.7&to=10.96.0.10:9")
	assert.Equal(t, http.StatusGatewayTimeout, code, body)
	code, _ = httpGet(t, srv.URL+"/trace?from=198.51.100.7&to=10.96.0.10:80&timeout=1h")
	assert.Equal(t, http.StatusBadRequest, code)

	var out, errOut bytes.Buffer
	p := Program{Name: "kproxy"}
	rc := p.Run(context.Background(), []string{"trace", "--server", strings.TrimPrefix(srv.URL, "http://"),
		"--from", "198.51.100.7", "--to", "10.96.0.10:80/tcp", "--json"}, &out, &errOut)
	require.Equal(t, 0, rc, errOut.String())
	var tr servicelb.Trace
	require.NoError(t, json.Unmarshal(out.Bytes(), &tr))
	assert.Equal(t, "services", tr.Steps[0].Chain)

	plain := httptest.NewServer(inspectHandler(Config{Backend: "userspace"}, &in, func() *servicelb.State { return st }, nil))
	defer plain.Close()
	code, body = httpGet(t, plain.URL+"/trace?from=198.51.100.7&to=10.96.0.10:80")
	assert.Equal(t, http.StatusNotImplemented, code)
	assert.Contains(t, body, "the userspace backend cannot trace packets: nftables and iptables can")
}

func TestParseFlow(t *testing.T) {
	f, err := ParseFlow("10.244.1.5", "10.96.0.10:53/udp", "", "pod", "")
	require.NoError(t, err)
	assert.Equal(t, servicelb.UDP, f.Protocol)
	assert.Equal(t, netip.MustParseAddrPort("10.244.1.5:0"), f.Src)
	require.NotNil(t, f.Origin)
	assert.Equal(t, servicelb.FromPod, *f.Origin)
	for _, bad := range [][5]string{
		{"10.0.0.1", "10.96.0.10", "", "", ""},
		{"10.0.0.1", "10.96.0.10:80", "icmp", "", ""},
		{"10.0.0.1", "10.96.0.10:80", "", "mars", ""},
		{"", "10.96.0.10:80", "", "", ""},
	} {
		_, err := ParseFlow(bad[0], bad[1], bad[2], bad[3], bad[4])
		assert.Error(t, err, "%q", bad)
	}
}
