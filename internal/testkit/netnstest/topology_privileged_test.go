//go:build privileged

package netnstest_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestTopologyCarriesTraffic asks every backend directly from the client,
// over TCP and UDP, IPv4 and IPv6: the node routes both ways, the reply
// names the backend and shows the client's own address.
func TestTopologyCarriesTraffic(t *testing.T) {
	netnstest.Require(t)
	tp := netnstest.New(t, netnstest.Options{})
	if len(tp.Backends) != 3 {
		t.Fatalf("got %d backends, want the default 3", len(tp.Backends))
	}
	for _, b := range tp.Backends {
		b.Serve(t, "tcp", 8080)
		b.Serve(t, "udp", 8080)
	}
	for _, b := range tp.Backends {
		for _, proto := range []string{"tcp", "udp"} {
			for _, pair := range [][2]netip.Addr{{b.IPv4, tp.Client.IPv4}, {b.IPv6, tp.Client.IPv6}} {
				dst := netip.AddrPortFrom(pair[0], 8080)
				r, err := tp.Client.Ask(t.Context(), proto, dst)
				if err != nil {
					t.Fatalf("%s %s: %v", proto, dst, err)
				}
				if r.Host != b.Name || r.Client.Addr() != pair[1] || r.Client.Port() == 0 {
					t.Errorf("%s %s: reply %+v, want host %s from client %s", proto, dst, r, b.Name, pair[1])
				}
			}
		}
	}
}

// TestAddressing checks the fixed addressing and links with the ip tool.
func TestAddressing(t *testing.T) {
	netnstest.Require(t)
	tp := netnstest.New(t, netnstest.Options{Backends: 2})
	want := map[*netnstest.Host][]string{
		tp.Client:      {"eth0", "198.51.100.2/24", "fd00:c::2/64"},
		tp.Backends[0]: {"eth0", "10.244.1.2/24", "fd00:244:1::2/64"},
		tp.Backends[1]: {"eth0", "10.244.2.2/24", "fd00:244:2::2/64"},
		tp.Node: {"ext0", "198.51.100.1/24", "fd00:c::1/64", "veth0", "10.244.1.1/24", "fd00:244:1::1/64",
			"veth1", "10.244.2.1/24", "fd00:244:2::1/64"},
	}
	for h, words := range want {
		out := h.Exec(t, "ip", "-o", "addr", "show")
		for _, w := range words {
			if !strings.Contains(out, " "+w+" ") && !strings.Contains(out, " "+w+":") && !strings.Contains(out, " "+w+"\\") {
				t.Errorf("%s: %q not in\n%s", h.Name, w, out)
			}
		}
		if strings.Contains(out, "tentative") {
			t.Errorf("%s: tentative IPv6 address (duplicate address detection not off):\n%s", h.Name, out)
		}
	}
	if got := strings.TrimSpace(tp.Node.Exec(t, "sysctl", "-n", "net.ipv4.ip_forward")); got != "1" {
		t.Errorf("node ip_forward = %s", got)
	}
	if got := strings.TrimSpace(tp.Node.Exec(t, "sysctl", "-n", "net.ipv6.conf.all.forwarding")); got != "1" {
		t.Errorf("node ipv6 forwarding = %s", got)
	}
	if got := strings.TrimSpace(tp.Client.Exec(t, "sysctl", "-n", "net.ipv4.ip_forward")); got != "0" {
		t.Errorf("client ip_forward = %s, want 0", got)
	}
	route := tp.Backends[1].Exec(t, "ip", "-6", "route", "show", "default")
	if !strings.Contains(route, "via fd00:244:2::1 dev eth0") {
		t.Errorf("backend-1 IPv6 default route: %q", route)
	}
	if b := tp.Backends[1]; b.NodeLink != "veth1" || b.Gateway4 != netip.MustParseAddr("10.244.2.1") {
		t.Errorf("backend-1 fields: %+v", b)
	}
	if got := filepath.Join(netnstest.RunDir, tp.Node.NSName); !strings.HasPrefix(tp.Node.NSName, netnstest.Prefix) {
		t.Errorf("namespace %s lacks the prefix", got)
	}
}

// TestRefusedAndTimeout tells a closed port (TCP reset, ICMP port
// unreachable), a rejecting firewall (ICMP administratively prohibited)
// and a dropping one (silence) apart, for both protocols and families.
func TestRefusedAndTimeout(t *testing.T) {
	netnstest.Require(t, "nf_tables")
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	b := tp.Backends[0]
	b.Serve(t, "tcp", 8080)
	b.Serve(t, "udp", 8080)
	b.Serve(t, "tcp", 8081)
	b.Serve(t, "udp", 8081)
	b.Serve(t, "tcp", 8082)
	b.Serve(t, "udp", 8082)
	b.ExecInput(t, `table inet kpt_test {
	chain in {
		type filter hook input priority 0;
		th dport 8081 drop
	}
}`, "nft", "-f", "-")
	tp.Node.ExecInput(t, `table inet kpt_test {
	chain forward {
		type filter hook forward priority 0;
		meta l4proto { tcp, udp } th dport 8082 reject with icmpx admin-prohibited
	}
}`, "nft", "-f", "-")
	cases := []struct {
		port uint16
		want error
	}{{8080, nil}, {9, netnstest.ErrRefused}, {8081, netnstest.ErrTimeout}, {8082, netnstest.ErrRefused}}
	for _, proto := range []string{"tcp", "udp"} {
		for _, a := range []netip.Addr{b.IPv4, b.IPv6} {
			for _, c := range cases {
				dst := netip.AddrPortFrom(a, c.port)
				start := time.Now()
				_, err := tp.Client.Ask(t.Context(), proto, dst, netnstest.Timeout(300*time.Millisecond))
				took := time.Since(start)
				if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
					t.Errorf("%s %s: got %v, want %v", proto, dst, err, c.want)
					continue
				}
				other := netnstest.ErrTimeout
				if c.want == netnstest.ErrTimeout {
					other = netnstest.ErrRefused
				}
				if c.want != nil && errors.Is(err, other) {
					t.Errorf("%s %s: %v is both refused and timed out", proto, dst, err)
				}
				if c.want == netnstest.ErrRefused && took > 200*time.Millisecond {
					t.Errorf("%s %s: refusal took %v", proto, dst, took)
				}
			}
		}
	}
}

// TestWatchICMP tells an ICMP port unreachable from a TCP reset, which a
// TCP client sees alike, and reports the ICMP error of a UDP refusal.
func TestWatchICMP(t *testing.T) {
	netnstest.Require(t, "nf_tables")
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	b := tp.Backends[0]
	tp.Node.ExecInput(t, `table inet kpt_test {
	chain forward {
		type filter hook forward priority 0;
		tcp dport 8081 reject with tcp reset
		meta l4proto { tcp, udp } th dport 8082 reject
	}
}`, "nft", "-f", "-")
	for _, a := range []netip.Addr{b.IPv4, b.IPv6} {
		for _, c := range []struct {
			proto string
			port  uint16
			icmp  bool
		}{{"tcp", 8081, false}, {"tcp", 8082, true}, {"udp", 8082, true}} {
			dst := netip.AddrPortFrom(a, c.port)
			_, err := tp.Client.Ask(t.Context(), c.proto, dst, netnstest.WatchICMP())
			var ae *netnstest.AskError
			if !errors.As(err, &ae) || !errors.Is(err, netnstest.ErrRefused) {
				t.Fatalf("%s %s: %v, want a refusal", c.proto, dst, err)
			}
			switch {
			case c.icmp && (ae.ICMP == nil || !ae.ICMP.PortUnreachable()):
				t.Errorf("%s %s: ICMP %v, want a port unreachable", c.proto, dst, ae.ICMP)
			case !c.icmp && ae.ICMP != nil:
				t.Errorf("%s %s: ICMP %v, want none (a reset)", c.proto, dst, ae.ICMP)
			}
		}
	}
}

// TestCount counts asks per backend and counts failures on request.
func TestCount(t *testing.T) {
	netnstest.Require(t)
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	b := tp.Backends[0]
	b.Serve(t, "tcp", 8080)
	b.Serve(t, "udp", 8080)
	for _, proto := range []string{"tcp", "udp"} {
		for _, a := range []netip.Addr{b.IPv4, b.IPv6} {
			start := time.Now()
			got := tp.Client.Count(t, proto, netip.AddrPortFrom(a, 8080), 300)
			t.Logf("300 %s asks to %s: %v", proto, a, time.Since(start))
			if len(got) != 1 || got[b.Name] != 300 {
				t.Errorf("%s %s: counts %v, want %s:300", proto, a, got, b.Name)
			}
		}
	}
	got := tp.Client.Count(t, "udp", netip.AddrPortFrom(b.IPv4, 9), 50, netnstest.CountFailures())
	if len(got) != 1 || got[netnstest.KeyRefused] != 50 {
		t.Errorf("closed port: counts %v, want %s:50 (ICMP rate limits off)", got, netnstest.KeyRefused)
	}

	// A Count that expects answers waits for a slow one, longer than
	// DefaultTimeout: a server that answers after 1.5 s.
	const slow = 1500 * time.Millisecond
	var ln net.Listener
	if err := b.Do(func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(b.IPv4, 8081).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.ServeConns(ln, func(c net.Conn) {
		defer c.Close()
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			return
		}
		time.Sleep(slow)
		fmt.Fprintf(c, "slow %s 8081\n", c.RemoteAddr())
	})
	if got := tp.Client.Count(t, "tcp", netip.AddrPortFrom(b.IPv4, 8081), 2); got["slow"] != 2 {
		t.Errorf("slow server: counts %v, want slow:2", got)
	}
}

// TestAddAddress gives the client more source addresses, on its link's
// subnet and outside it, and checks the backend sees each.
func TestAddAddress(t *testing.T) {
	netnstest.Require(t)
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	b := tp.Backends[0]
	b.Serve(t, "tcp", 8080)
	b.Serve(t, "udp", 8080)
	for _, p := range []string{"198.51.100.7/24", "203.0.113.9/32", "fd00:c::7/64", "2001:db8:9::9/128"} {
		pfx := netip.MustParsePrefix(p)
		tp.Client.AddAddress(t, pfx)
		dstAddr := b.IPv4
		if pfx.Addr().Is6() {
			dstAddr = b.IPv6
		}
		for _, proto := range []string{"tcp", "udp"} {
			r, err := tp.Client.Ask(t.Context(), proto, netip.AddrPortFrom(dstAddr, 8080),
				netnstest.FromAddr(pfx.Addr()), netnstest.FromPort(40001))
			if err != nil {
				t.Fatalf("%s from %s: %v", proto, pfx, err)
			}
			if want := netip.AddrPortFrom(pfx.Addr(), 40001); r.Client != want {
				t.Errorf("%s from %s: server saw %s, want %s", proto, pfx, r.Client, want)
			}
		}
	}
}

// TestNewHost checks a lone namespace: loopback works, nothing else.
func TestNewHost(t *testing.T) {
	netnstest.Require(t)
	h := netnstest.NewHost(t, "lone")
	h.Serve(t, "tcp", 7000)
	// Exec and Count also work in cleanup, after the test's context ends.
	t.Cleanup(func() {
		h.Exec(t, "ip", "link", "show", "lo")
		if got := h.Count(t, "tcp", netip.MustParseAddrPort("127.0.0.1:7000"), 3); got["lone"] != 3 {
			t.Errorf("count in cleanup: %v", got)
		}
	})
	r, err := h.Ask(t.Context(), "tcp", netip.MustParseAddrPort("127.0.0.1:7000"))
	if err != nil || r.Host != "lone" {
		t.Fatalf("loopback ask: %+v, %v", r, err)
	}
	out := h.Exec(t, "ip", "-o", "link", "show")
	if n := strings.Count(strings.TrimSpace(out), "\n") + 1; n != 1 {
		t.Errorf("lone host has %d links, want only lo:\n%s", n, out)
	}
	if _, err := os.Stat(filepath.Join(netnstest.RunDir, h.NSName)); err != nil {
		t.Errorf("named namespace: %v", err)
	}
}

// BenchmarkAsk measures one ask from the client to a backend through the
// node, per protocol and family.
func BenchmarkAsk(b *testing.B) {
	netnstest.Require(b)
	tp := netnstest.New(b, netnstest.Options{Backends: 1})
	be := tp.Backends[0]
	for _, proto := range []string{"tcp", "udp"} {
		be.Serve(b, proto, 8080)
		for _, a := range []netip.Addr{be.IPv4, be.IPv6} {
			dst := netip.AddrPortFrom(a, 8080)
			b.Run(proto+"/"+a.String(), func(b *testing.B) {
				for b.Loop() {
					if _, err := tp.Client.Ask(b.Context(), proto, dst); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestLinksNamedAndBridged: Options.Links names the node's end of a
// backend's link and puts it under a bridge that holds the node's
// addresses for it; traffic still flows both ways, and the node sees a
// bridged backend's packets come in on the bridge, a named link's on its
// name. Options that the kernel would refuse or that clash fail New.
func TestLinksNamedAndBridged(t *testing.T) {
	netnstest.Require(t, "nf_tables", "bridge")
	tp := netnstest.New(t, netnstest.Options{Backends: 4, Links: map[int]netnstest.Link{
		0: {Name: "pod0"}, 1: {Bridge: "cbr0"}, 2: {Name: "pod2", Bridge: "cbr0"},
	}})
	b0, b1, b2, b3 := tp.Backends[0], tp.Backends[1], tp.Backends[2], tp.Backends[3]
	for _, c := range []struct {
		h            *netnstest.Host
		link, bridge string
	}{{b0, "pod0", ""}, {b1, "veth1", "cbr0"}, {b2, "pod2", "cbr0"}, {b3, "veth3", ""}} {
		if c.h.NodeLink != c.link || c.h.NodeBridge != c.bridge {
			t.Errorf("%s: node link %q bridge %q, want %q %q", c.h.Name, c.h.NodeLink, c.h.NodeBridge, c.link, c.bridge)
		}
	}
	links := tp.Node.Exec(t, "ip", "-o", "link", "show")
	for _, want := range []string{"pod0@", "veth1@", "pod2@", "veth3@", "cbr0:"} {
		if !strings.Contains(links, want) {
			t.Errorf("node links lack %q:\n%s", want, links)
		}
	}
	for _, port := range []string{"veth1", "pod2"} {
		if out := tp.Node.Exec(t, "ip", "-o", "link", "show", port); !strings.Contains(out, "master cbr0") {
			t.Errorf("%s not a port of cbr0: %s", port, out)
		}
	}
	addrs := tp.Node.Exec(t, "ip", "-o", "addr", "show", "dev", "cbr0")
	for _, want := range []string{"10.244.2.1/24", "fd00:244:2::1/64", "10.244.3.1/24", "fd00:244:3::1/64"} {
		if !strings.Contains(addrs, want) {
			t.Errorf("cbr0 lacks %s:\n%s", want, addrs)
		}
	}
	// Count, in the node, the backends' packets by the interface they
	// come in on.
	tp.Node.ExecInput(t, `table inet kpt_test {
	chain forward {
		type filter hook forward priority 0;
		iifname "pod0" ip saddr 10.244.1.2 counter comment "pod0"
		iifname "cbr0" ip saddr 10.244.2.2 counter comment "cbr0-1"
		iifname "cbr0" ip6 saddr fd00:244:3::2 counter comment "cbr0-2"
		iifname "veth1" counter comment "port"
	}
}`, "nft", "-f", "-")
	b1.AddAddress(t, netip.MustParsePrefix("10.250.0.1/32"))
	for _, b := range tp.Backends {
		b.Serve(t, "tcp", 8080)
		b.Serve(t, "udp", 8080)
	}
	for _, b := range tp.Backends {
		for _, proto := range []string{"tcp", "udp"} {
			for _, a := range []netip.Addr{b.IPv4, b.IPv6} {
				if r, err := tp.Client.Ask(t.Context(), proto, netip.AddrPortFrom(a, 8080)); err != nil || r.Host != b.Name {
					t.Errorf("%s %s: %+v %v", proto, a, r, err)
				}
			}
		}
	}
	if r, err := tp.Client.Ask(t.Context(), "tcp", netip.MustParseAddrPort("10.250.0.1:8080")); err != nil || r.Host != b1.Name {
		t.Errorf("an address added to a bridged backend: %+v %v", r, err)
	}
	listed := tp.Node.Exec(t, "nft", "list", "table", "inet", "kpt_test")
	for _, c := range []struct {
		comment string
		seen    bool
	}{{"pod0", true}, {"cbr0-1", true}, {"cbr0-2", true}, {"port", false}} {
		line := ""
		for _, l := range strings.Split(listed, "\n") {
			if strings.Contains(l, `comment "`+c.comment+`"`) {
				line = l
			}
		}
		if seen := line != "" && !strings.Contains(line, "counter packets 0 "); seen != c.seen {
			t.Errorf("rule %q counted packets: %v, want %v:\n%s", c.comment, seen, c.seen, listed)
		}
	}
}

// TestLinksRefused: names the kernel would refuse or that clash fail New.
func TestLinksRefused(t *testing.T) {
	netnstest.Require(t)
	for name, links := range map[string]map[int]netnstest.Link{
		"too long":        {0: {Name: "a-very-long-link-name"}},
		"taken":           {0: {Name: "veth1"}},
		"the client's":    {1: {Name: netnstest.ClientLink}},
		"bridge is link":  {0: {Bridge: "veth1"}},
		"no such backend": {5: {Name: "pod5"}},
	} {
		t.Run(name, func(t *testing.T) {
			ft := &fatalRecorder{TB: t}
			func() {
				defer func() { _ = recover() }()
				netnstest.New(ft, netnstest.Options{Backends: 2, Links: links})
			}()
			if !ft.failed {
				t.Errorf("New accepted links %+v", links)
			}
		})
	}
}

// fatalRecorder records a Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	failed bool
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.failed = true
	panic("fatal")
}
