//go:build linux

package userspace

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The tests run without privileges on loopback: endpoints have addresses
// of 10.0.0.0/24 in the states (servicelb accepts no loopback endpoint),
// and the proxy connects to loopback servers standing in for them
// (sockets.redirect); the proxy listens on loopback ports (ListenAt).
const (
	tcpTarget = 8080
	udpTarget = 8053
)

func epAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}) }

// ep returns a ready endpoint on host i.
func ep(i int) servicelb.Endpoint {
	return servicelb.Endpoint{Addr: epAddr(i), NodeName: "elsewhere"}
}

func weighted(w uint16, e servicelb.Endpoint) servicelb.Endpoint {
	e.Weight = servicelb.Weight(w)
	return e
}

// service returns a service with a TCP port 80 and a UDP port 53 on
// cluster IP 10.96.0.<n>, served by eps.
func service(n int, eps ...servicelb.Endpoint) servicelb.Service {
	return servicelb.Service{
		Name:       fmt.Sprintf("ns/svc%d", n),
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(n)})},
		Ports: []servicelb.Port{
			{Name: "tcp", Protocol: servicelb.TCP, Port: 80, TargetPort: tcpTarget},
			{Name: "udp", Protocol: servicelb.UDP, Port: 53, TargetPort: udpTarget},
		},
		Endpoints: eps,
	}
}

func key(svc int, port string) servicelb.ServicePortKey {
	return servicelb.ServicePortKey{Service: fmt.Sprintf("ns/svc%d", svc), Port: port, Family: servicelb.IPv4}
}

func mustState(t testing.TB, node servicelb.NodeConfig, svcs ...servicelb.Service) *servicelb.State {
	t.Helper()
	st, err := servicelb.NewState(node, svcs...)
	require.NoError(t, err)
	return st
}

// world is the loopback stand-ins of the endpoints: host i answers TCP
// at epAddr(i):tcpTarget and UDP at epAddr(i):udpTarget.
type world struct {
	mu   sync.Mutex
	real map[netip.AddrPort]netip.AddrPort
	tcp  []*tcpServer
	// listen are the loopback addresses the proxy listens at, by service
	// port.
	listen map[servicelb.ServicePortKey]netip.AddrPort
}

func newWorld(t testing.TB, hosts int) *world {
	w := &world{real: map[netip.AddrPort]netip.AddrPort{}, listen: map[servicelb.ServicePortKey]netip.AddrPort{}}
	for i := range hosts {
		name := fmt.Sprintf("ep-%d", i)
		ts := startTCP(t, name)
		w.tcp = append(w.tcp, ts)
		w.real[netip.AddrPortFrom(epAddr(i), tcpTarget)] = ts.at
		w.real[netip.AddrPortFrom(epAddr(i), udpTarget)] = startUDP(t, name)
	}
	return w
}

// redirect connects the proxy to the stand-in of an endpoint; to a
// closed loopback port for an endpoint without one.
func (w *world) redirect(ap netip.AddrPort) netip.AddrPort {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r, ok := w.real[ap]; ok {
		return r
	}
	return netip.MustParseAddrPort("127.0.0.1:1")
}

// listenFunc listens for each service port's first frontend at a loopback
// address of its own, picked on first use.
func (w *world) listenFunc(t testing.TB) ListenFunc {
	return func(sp *servicelb.ServicePort, f servicelb.Frontend) (netip.AddrPort, bool) {
		if fs := sp.Frontends(); len(fs) == 0 || fs[0] != f {
			return netip.AddrPort{}, false
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if at, ok := w.listen[sp.Key]; ok {
			return at, true
		}
		at := freePort(t)
		w.listen[sp.Key] = at
		return at, true
	}
}

// at returns where the proxy listens for a service port.
func (w *world) at(k servicelb.ServicePortKey) netip.AddrPort {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.listen[k]
}

// freePort returns a loopback address and port that no TCP or UDP socket
// holds now.
func freePort(t testing.TB) netip.AddrPort {
	t.Helper()
	for {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		require.NoError(t, err)
		at := l.Addr().(*net.TCPAddr).AddrPort()
		u, err := net.ListenPacket("udp4", at.String())
		l.Close()
		if err == nil {
			u.Close()
			return at
		}
	}
}

// newProxier returns a proxier in the test's namespace, listening on
// loopback and connecting to the world's stand-ins, closed at the end.
func newProxier(t testing.TB, w *world, o Options) *Proxier {
	t.Helper()
	if o.Listen == nil {
		o.Listen = w.listenFunc(t)
	}
	p, err := New(o)
	require.NoError(t, err)
	p.socks.redirect = w.redirect
	t.Cleanup(func() { p.Close() })
	return p
}

func mustSync(t testing.TB, p *Proxier, st *servicelb.State) {
	t.Helper()
	require.NoError(t, servicetest.SyncErr(p.Sync(context.Background(), st)))
}

// tcpServer answers each connection with its name and the client's
// address on a line, then echoes what it reads until the end of the
// stream, and ends its own.
type tcpServer struct {
	name string
	at   netip.AddrPort
	ln   net.Listener
}

func startTCP(t testing.TB, name string) *tcpServer {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	s := &tcpServer{name: name, at: ln.Addr().(*net.TCPAddr).AddrPort(), ln: ln}
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open[c] = true
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(open, c)
					mu.Unlock()
					c.Close()
				}()
				fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			})
		}
	})
	return s
}

// startUDP answers each datagram with its name, a space and the
// datagram.
func startUDP(t testing.TB, name string) netip.AddrPort {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 1<<16)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte(name+" "), buf[:n]...), from)
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// askTCP connects to at and returns the name of the endpoint that
// answered.
func askTCP(t testing.TB, at netip.AddrPort) string {
	t.Helper()
	name, err := tryTCP(at)
	require.NoError(t, err)
	return name
}

func tryTCP(at netip.AddrPort) (string, error) {
	c, err := net.DialTimeout("tcp", at.String(), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	name, _, _ := strings.Cut(line, " ")
	return name, nil
}

// askUDP sends a datagram to at from a fresh socket and returns the name
// of the endpoint that answered and the address the answer came from.
func askUDP(t testing.TB, at netip.AddrPort) (string, netip.AddrPort) {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer pc.Close()
	return sendUDP(t, pc, at, "hello")
}

func sendUDP(t testing.TB, pc *net.UDPConn, at netip.AddrPort, msg string) (string, netip.AddrPort) {
	t.Helper()
	_, err := pc.WriteToUDPAddrPort([]byte(msg), at)
	require.NoError(t, err)
	pc.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1<<16)
	n, from, err := pc.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)
	name, rest, _ := strings.Cut(string(buf[:n]), " ")
	require.Equal(t, msg, rest)
	return name, from
}

// count asks n times and counts the answers by endpoint name.
func count(t testing.TB, at netip.AddrPort, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for range n {
		out[askTCP(t, at)]++
	}
	return out
}

// stats returns the counters of one service port.
func stats(t testing.TB, p *Proxier, k servicelb.ServicePortKey) PortStats {
	t.Helper()
	for _, s := range p.Stats() {
		if s.Key == k {
			return s
		}
	}
	t.Fatalf("no stats for %s", k)
	return PortStats{}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}
