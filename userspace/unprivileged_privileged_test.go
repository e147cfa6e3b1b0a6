//go:build privileged

package userspace_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/nsutil"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
	"github.com/kproxy-dev/kproxy/userspace"
)

// The proxy without privileges: the test binary starts itself again in
// the node's namespace (unprivilegedEnv set), the child drops to uid and
// gid 65534 with no capability left, and serves a userspace proxier
// there, driven over its standard input and output by a servicelb.Proxier
// of the parent's (remote). The proxier holds no address: it listens where
// Options.Listen says (the listen-at mode), and the conformance kit asks
// there (conformance.Backend.Redirect). The mapping, decided by the
// parent for each State and sent with it:
//
//   - a frontend on an address the node has (its NodeIPs and LocalIPs:
//     node ports, external IPs that are node addresses; the loopback:
//     localhost node ports) at a port of 1024 or more listens where it is;
//   - every other frontend (cluster IPs, external and load-balancer IPs,
//     ports below net.ipv4.ip_unprivileged_port_start) listens at the
//     node's address of its family and a port of its own, from 10000 on,
//     kept for the run (the kit's node ports start at 30000, the
//     node's ephemeral ports at 32768).
//
// A check to a frontend then asks at its listener, from the same origin:
// the proxy tells the origin from the client's address (and interface),
// and applies the verdicts of the frontend the listener stands for.

// unprivilegedEnv makes the test binary serve a proxier without
// privileges on its standard input and output.
const unprivilegedEnv = "KPROXY_USERSPACE_UNPRIVILEGED"

// nobody is the uid and gid the child runs as.
const nobody = 65534

// childFiles is the child's limit of open descriptors: few enough that
// the kit's flood of 1,000 connections (two descriptors each) would
// exhaust it without the flow budget, enough for the kit's other asks
// within the budget's share of it.
const childFiles = 2048

func TestMain(m *testing.M) {
	if os.Getenv(unprivilegedEnv) == "1" {
		os.Exit(serveUnprivileged(os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// request is one call of the parent's proxier.
type request struct {
	// Op is "sync", "cleanup" or "hold" (New with HoldAddresses).
	Op       string               `json:"op"`
	Node     servicelb.NodeConfig `json:"node"`
	Services []*servicelb.Service `json:"services,omitempty"`
	Listen   []listenAt           `json:"listen,omitempty"`
}

// listenAt is where the proxy listens for a frontend.
type listenAt struct {
	Proto    servicelb.Protocol `json:"proto"`
	Frontend netip.AddrPort     `json:"frontend"`
	At       netip.AddrPort     `json:"at"`
}

// reply is the outcome of a request, or the child's first line.
type reply struct {
	Err        string         `json:"err,omitempty"`
	Permission bool           `json:"permission,omitempty"`
	Full       bool           `json:"full,omitempty"`
	LeftOut    []leftOutError `json:"leftOut,omitempty"`
	// The first line: who the child runs as, and its proxier's
	// capabilities.
	UID    int                     `json:"uid,omitempty"`
	CapEff string                  `json:"capEff,omitempty"`
	Caps   *servicelb.Capabilities `json:"caps,omitempty"`
}

// leftOutError is a service a sync left out, as far as errors.Is and
// errors.As tell it.
type leftOutError struct {
	Service, Field, Value, Msg string
	Kinds                      []string
}

// kinds are the servicelb errors a left-out service's error may wrap.
var kinds = map[string]error{
	"unsupported":    servicelb.ErrUnsupported,
	"capacity":       servicelb.ErrCapacity,
	"frontend-taken": servicelb.ErrFrontendTaken,
	"permission":     servicelb.ErrPermission,
}

// kindError is a left-out service's error again, in the parent.
type kindError struct {
	msg   string
	kinds []error
}

func (e *kindError) Error() string   { return e.msg }
func (e *kindError) Unwrap() []error { return e.kinds }

// toWire encodes an error.
func toWire(err error, r *reply) {
	if err == nil {
		return
	}
	r.Err = err.Error()
	r.Permission = errors.Is(err, servicelb.ErrPermission)
}

// reportToWire encodes a Sync's report: whether it was full, and the
// services it left out.
func reportToWire(rep servicelb.SyncReport, r *reply) {
	r.Full = rep.Full
	for name, e := range rep.LeftOut {
		lo := leftOutError{Service: name, Msg: e.Error()}
		var ve *servicelb.ValidationError
		if errors.As(e, &ve) {
			lo.Field, lo.Value = ve.Field, ve.Value
		}
		for k, kind := range kinds {
			if errors.Is(e, kind) {
				lo.Kinds = append(lo.Kinds, k)
			}
		}
		r.LeftOut = append(r.LeftOut, lo)
	}
}

// fromWire decodes an error.
func fromWire(r reply) error {
	if r.Err == "" {
		return nil
	}
	err := errors.New(r.Err)
	if r.Permission {
		err = fmt.Errorf("%w (%w)", err, servicelb.ErrPermission)
	}
	return err
}

// reportFromWire decodes the report of a Sync of st that succeeded.
func reportFromWire(r reply, st *servicelb.State) servicelb.SyncReport {
	rep := servicelb.SyncReport{Full: r.Full}
	var names []string
	for _, lo := range r.LeftOut {
		ke := &kindError{msg: lo.Msg}
		for _, k := range lo.Kinds {
			ke.kinds = append(ke.kinds, kinds[k])
		}
		if rep.LeftOut == nil {
			rep.LeftOut = map[string]error{}
		}
		rep.LeftOut[lo.Service] = &servicelb.ValidationError{Service: lo.Service, Field: lo.Field, Value: lo.Value, Err: ke}
		names = append(names, lo.Service)
	}
	rep.Applied = st.Without(names...)
	return rep
}

// serveUnprivileged is the child: it drops its privileges and serves
// requests until its input ends, then closes its proxier.
func serveUnprivileged(in io.Reader, out io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "unprivileged proxy:", err)
		return 1
	}
	// The descriptors of a process that systemd or a shell starts with
	// the common limit, which the proxier's flow budget then follows
	// (DefaultMaxFlows): the kit's flood scenario runs against it.
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: childFiles, Max: childFiles}); err != nil {
		return fail(err)
	}
	if err := errors.Join(syscall.Setgroups(nil), syscall.Setgid(nobody), syscall.Setuid(nobody)); err != nil {
		return fail(err)
	}
	var mu sync.Mutex
	listen := map[string]netip.AddrPort{}
	p, err := userspace.New(userspace.Options{Listen: func(sp *servicelb.ServicePort, f servicelb.Frontend) (netip.AddrPort, bool) {
		mu.Lock()
		defer mu.Unlock()
		at, ok := listen[frontendKey(sp.Port.Protocol, f.AddrPort())]
		return at, ok
	}})
	if err != nil {
		return fail(err)
	}
	defer p.Close()
	caps := p.Capabilities()
	enc, dec := json.NewEncoder(out), json.NewDecoder(in)
	if err := enc.Encode(reply{UID: os.Getuid(), CapEff: capEff(), Caps: &caps}); err != nil {
		return fail(err)
	}
	for {
		var req request
		if err := dec.Decode(&req); err == io.EOF {
			return 0
		} else if err != nil {
			return fail(err)
		}
		var r reply
		switch req.Op {
		case "sync":
			mu.Lock()
			for _, l := range req.Listen {
				listen[frontendKey(l.Proto, l.Frontend)] = l.At
			}
			mu.Unlock()
			rep, err := syncServices(p, req)
			reportToWire(rep, &r)
			toWire(err, &r)
		case "cleanup":
			toWire(p.Cleanup(context.Background()), &r)
		case "hold":
			q, err := userspace.New(userspace.Options{HoldAddresses: true})
			if err == nil {
				q.Close()
				err = errors.New("New with HoldAddresses succeeded")
			}
			toWire(err, &r)
		default:
			r.Err = "unknown op " + req.Op
		}
		if err := enc.Encode(r); err != nil {
			return fail(err)
		}
	}
}

func syncServices(p *userspace.Proxier, req request) (servicelb.SyncReport, error) {
	svcs := make([]servicelb.Service, len(req.Services))
	for i, s := range req.Services {
		svcs[i] = *s
	}
	st, err := servicelb.NewState(req.Node, svcs...)
	if err != nil {
		return servicelb.SyncReport{}, err
	}
	return p.Sync(context.Background(), st)
}

func frontendKey(p servicelb.Protocol, f netip.AddrPort) string { return string(p) + " " + f.String() }

// capEff returns the effective capabilities of the process, as
// /proc/self/status shows them.
func capEff() string {
	b, _ := os.ReadFile("/proc/self/status")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// listenMap decides where the child listens for each frontend (see the
// top of the file), and keeps it for the run.
type listenMap struct {
	mu   sync.Mutex
	at   map[string]netip.AddrPort
	next uint16
}

func newListenMap() *listenMap { return &listenMap{at: map[string]netip.AddrPort{}, next: 10000} }

// plan returns where the child listens for every frontend of st.
func (m *listenMap) plan(st *servicelb.State) []listenAt {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := st.Node()
	own := map[netip.Addr]bool{}
	for _, a := range append(append([]netip.Addr{}, n.NodeIPs...), n.LocalIPs...) {
		own[a] = true
	}
	var out []listenAt
	for _, sp := range st.Ports() {
		for _, f := range sp.Frontends() {
			k := frontendKey(sp.Port.Protocol, f.AddrPort())
			at, ok := m.at[k]
			if !ok {
				at = f.AddrPort()
				if !(own[f.Addr] || f.Addr.IsLoopback()) || f.Port < 1024 {
					at = netip.AddrPortFrom(nodeAddr(n, f.Addr.Is6()), m.next)
					m.next++
				}
				m.at[k] = at
			}
			out = append(out, listenAt{Proto: sp.Port.Protocol, Frontend: f.AddrPort(), At: at})
		}
	}
	return out
}

// nodeAddr returns the node's address of a family.
func nodeAddr(n servicelb.NodeConfig, v6 bool) netip.Addr {
	for _, a := range n.NodeIPs {
		if a.Is6() == v6 {
			return a
		}
	}
	if v6 {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// redirect says where the child listens for a frontend.
func (m *listenMap) redirect(p servicelb.Protocol, dst netip.AddrPort) (netip.AddrPort, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	at, ok := m.at[frontendKey(p, dst)]
	return at, ok
}

// remote is the parent's servicelb.Proxier: each call is a request to
// the child.
type remote struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	enc    *json.Encoder
	dec    *json.Decoder
	stderr *lockedBuffer
	first  reply
	listen *listenMap
	mu     sync.Mutex
	closed bool
	waited error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startRemote starts the child in namespace ns.
func startRemote(t testing.TB, ns netns.NsHandle, listen *listenMap) *remote {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	r := &remote{cmd: exec.Command(exe), stderr: &lockedBuffer{}, listen: listen}
	r.cmd.Env = append(os.Environ(), unprivilegedEnv+"=1")
	r.cmd.Stderr = r.stderr
	r.stdin, err = r.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := r.cmd.StdoutPipe()
	require.NoError(t, err)
	// Forked from a thread in the namespace, the child starts there.
	require.NoError(t, nsutil.Do(ns, r.cmd.Start))
	r.enc, r.dec = json.NewEncoder(r.stdin), json.NewDecoder(bufio.NewReader(stdout))
	if err := r.dec.Decode(&r.first); err != nil {
		r.Close()
		t.Fatalf("the unprivileged proxy did not start: %v\n%s", err, r.stderr)
	}
	return r
}

func (r *remote) call(req request) error {
	_, err := r.exchange(req)
	return err
}

// exchange sends a request and returns the child's reply, decoded.
func (r *remote) exchange(req request) (reply, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		// The child closed its proxier and exited.
		return reply{}, fmt.Errorf("unprivileged proxy: %s: %w", req.Op, servicelb.ErrClosed)
	}
	if err := r.enc.Encode(req); err != nil {
		return reply{}, fmt.Errorf("unprivileged proxy: %w\n%s", err, r.stderr)
	}
	var rep reply
	if err := r.dec.Decode(&rep); err != nil {
		return reply{}, fmt.Errorf("unprivileged proxy: %w\n%s", err, r.stderr)
	}
	return rep, fromWire(rep)
}

// Sync sends st's node and services, and where to listen.
func (r *remote) Sync(_ context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	req := request{Op: "sync", Node: st.Node(), Services: st.Services(), Listen: r.listen.plan(st)}
	if err := sameOnTheWire(req); err != nil {
		return servicelb.SyncReport{}, err
	}
	rep, err := r.exchange(req)
	if err != nil {
		return servicelb.SyncReport{Full: rep.Full}, err
	}
	return reportFromWire(rep, st), nil
}

// sameOnTheWire makes sure that the child reads the node and services the
// parent has.
func sameOnTheWire(req request) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	var back request
	if err := json.Unmarshal(b, &back); err != nil {
		return err
	}
	opts := []cmp.Option{cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{}, netip.AddrPort{})}
	if d := cmp.Diff(req, back, opts...); d != "" {
		return fmt.Errorf("the state does not survive its encoding (-sent +read):\n%s", d)
	}
	return nil
}

func (r *remote) Cleanup(context.Context) error { return r.call(request{Op: "cleanup"}) }

func (r *remote) Capabilities() servicelb.Capabilities { return *r.first.Caps }

// Close ends the child's input: it closes its proxier and exits. A
// second Close returns what the first did.
func (r *remote) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.waited
	}
	r.closed = true
	r.stdin.Close()
	if err := r.cmd.Wait(); err != nil {
		r.waited = fmt.Errorf("unprivileged proxy: %w\n%s", err, r.stderr)
	}
	return r.waited
}

// TestUnprivileged: the child runs as nobody with no capability, and New
// with HoldAddresses refuses there at once, with servicelb.ErrPermission
// and the capability it lacks named.
func TestUnprivileged(t *testing.T) {
	h := netnstest.NewHost(t, "node")
	r := startRemote(t, h.NS, newListenMap())
	defer r.Close()
	assert.Equal(t, nobody, r.first.UID)
	assert.Equal(t, "0000000000000000", r.first.CapEff)
	err := r.call(request{Op: "hold"})
	require.ErrorIs(t, err, servicelb.ErrPermission)
	assert.Contains(t, err.Error(), "HoldAddresses needs CAP_NET_ADMIN")
}

// TestConformanceUnprivileged runs the conformance kit over TCP and UDP
// on the proxier without privileges (the child), listening at the node's
// addresses. It leaves out what the privileged run leaves out and the
// rejection of a cluster IP's undefined port: no cluster IP is on the
// node to refuse a port no service has (a flow to it is routed away,
// where with held addresses the kernel refuses it as any closed port), so
// the proxier declares no servicelb.FeatureUndefinedPorts.
func TestConformanceUnprivileged(t *testing.T) {
	listen := newListenMap()
	conformance.Run(t, conformance.Backend{
		Name: "userspace (unprivileged, listen-at)",
		New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier {
			return startRemote(t, ns, listen)
		},
		Redirect: listen.redirect,
	}, conformance.Options{NotApplicable: []string{
		"cluster-ip/undefined-port-rejected",
		"cluster-ip/unallocated-service-address-dropped", "left-out/endpoint-capacity", "scheduler/maglev-spreads-one-clients-connections",
		"node-port/ports-stay-free", "stale-flows/no-serving-endpoint-keeps-its-flows", "stale-flows/deleted-service-keeps-its-flows",
	}})
}
