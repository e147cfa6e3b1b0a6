// Package benchwork generates the services both sides of the comparison
// with kube-proxy load (make bench-compare): kproxy's driver
// (internal/testkit/cmd/kproxy-bench) and kube-proxy's (the bench module's
// cmd/kubeproxy-driver) build their objects from it, each prints the
// digest of the workload it was asked for, and the bench checks that they
// agree. It imports the standard library alone, so that the bench module
// takes nothing else of the core with it.
//
// n ClusterIP services of one TCP port (80 to 8080), each with m ready
// endpoints of addresses of their own; the first endpoint of every tenth
// service is on this node (node-0), the others are spread over 99 more.
//
// It also holds what the core's benchmarks measure with: the process's
// resident memory (Memory), its live Go heap (Heap), the kernel's own
// memory where BPF maps and nf_tables objects live (KernelMemory), and
// the verdict on a path against a reference from the ratios of rounds
// taken in turn (Judge). Connect is the data-path probe both drivers'
// measurements and the IPVS backend's in-VM benchmark share: TCP connect
// times through a node. Package benchlb makes servicelb's model of the
// workload, for the programs that may import the core.
package benchwork

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Namespace holds every service.
const Namespace = "bench"

// Node is the node the proxier runs on, NodeIP its address, ClusterCIDR
// the pods' addresses and ServiceCIDR the services'.
const (
	Node        = "node-0"
	NodeIP      = "192.0.2.1"
	ClusterCIDR = "10.64.0.0/10"
	ServiceCIDR = "172.16.0.0/12"
)

// Endpoint is one endpoint: its address and node.
type Endpoint struct {
	Addr netip.Addr
	Node string
}

// Service is one service of port 80 to target port 8080.
type Service struct {
	Name      string // without the namespace
	VIP       netip.Addr
	Endpoints []Endpoint
}

// ClusterIP is service i's address, in 172.16.0.0/12.
func ClusterIP(i int) netip.Addr {
	x := i + 1
	return netip.AddrFrom4([4]byte{172, 16 + byte(x>>16), byte(x >> 8), byte(x)})
}

// Endpoint address bases: base endpoints, replacements, added services.
const (
	BaseEndpoints    = 64
	BaseReplacements = 100
	BaseAdded        = 110
)

// EndpointIP is the x-th endpoint address from base, in 10.64.0.0/10.
func EndpointIP(base byte, x int) netip.Addr {
	x++
	return netip.AddrFrom4([4]byte{10, base + byte(x>>16), byte(x >> 8), byte(x)})
}

// NodeOf is the node of service i's j-th endpoint.
func NodeOf(i, j, m int) string {
	if j == 0 && i%10 == 0 {
		return Node
	}
	return "node-" + strconv.Itoa(1+(i*m+j)%99)
}

// Make returns service i with m endpoints from base.
func Make(name string, vip netip.Addr, i, m int, base byte) Service {
	eps := make([]Endpoint, m)
	for j := range eps {
		eps[j] = Endpoint{Addr: EndpointIP(base, i*m+j), Node: NodeOf(i, j, m)}
	}
	return Service{Name: name, VIP: vip, Endpoints: eps}
}

// Generate returns the n services of m endpoints.
func Generate(n, m int) []Service {
	out := make([]Service, n)
	for i := range out {
		out[i] = Make("svc-"+strconv.Itoa(i), ClusterIP(i), i, m, BaseEndpoints)
	}
	return out
}

// Added is the x-th service added after the cold sync.
func Added(x, m int) Service {
	return Make("add-"+strconv.Itoa(x), ClusterIP(1<<19+x), x, m, BaseAdded)
}

// Digest is a hash of the services' canonical text.
func Digest(svcs []Service) string {
	h := sha256.New()
	for _, s := range svcs {
		fmt.Fprintf(h, "%s/%s %s %d>%d", Namespace, s.Name, s.VIP, 80, 8080)
		for _, e := range s.Endpoints {
			fmt.Fprintf(h, " %s@%s", e.Addr, e.Node)
		}
		fmt.Fprintln(h)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Probed are the services whose endpoints the data-path probe reaches:
// the first, the middle and the last.
func Probed(n int) []int { return []int{0, n / 2, n - 1} }

// ChangeTarget is the service whose endpoint the k-th one-endpoint change
// replaces (never a probed one), and which endpoint.
func ChangeTarget(k, n, m int) (svc, ep int) {
	svc = (k*7919 + 13) % n
	for svc == 0 || svc == n/2 || svc == n-1 {
		svc = (svc + 1) % n
	}
	return svc, k % m
}

// Memory reads the calling process's resident set (VmRSS) and its peak
// (VmHWM), in KiB, keyed rss_kib and hwm_kib. Processes the proxier runs
// (nft, iptables-restore) are their own, not counted here.
func Memory() (map[string]any, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]any{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		for _, k := range []string{"VmRSS", "VmHWM"} {
			if v, ok := strings.CutPrefix(s.Text(), k+":"); ok {
				kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
				if err != nil {
					return nil, err
				}
				out[strings.ToLower(k[2:])+"_kib"] = kb
			}
		}
	}
	return out, s.Err()
}

// Budget runs f up to k times, or fewer once ms milliseconds are spent
// (at least 3 runs), and returns the time of each run in milliseconds.
func Budget(k, ms int, f func(i int) (time.Duration, error)) ([]float64, error) {
	var out []float64
	start := time.Now()
	for i := range k {
		if i >= 3 && time.Since(start) > time.Duration(ms)*time.Millisecond {
			break
		}
		d, err := f(i)
		if err != nil {
			return out, err
		}
		out = append(out, float64(d.Nanoseconds())/1e6)
	}
	return out, nil
}

// Latency is what a probe measured: the connect times' median and 99th
// percentile in microseconds (nearest rank), the connections made and
// those that failed.
type Latency struct {
	P50    float64 `json:"p50_us"`
	P99    float64 `json:"p99_us"`
	N      int     `json:"n"`
	Failed int     `json:"failed"`
}

// Connect opens n TCP connections, round robin over targets (addr:port),
// each a new flow, and returns the connect times' percentiles: a connect
// returns with the SYN-ACK, one round trip through the node's rules for
// a new flow. It fails when no connection succeeds.
func Connect(targets []string, n int, timeout time.Duration) (Latency, error) {
	times, failed := ConnectTimes(targets, n, timeout)
	return Percentiles(times, failed)
}

// ConnectBoth makes n connections through targets and n to direct (the
// same path without the service) in alternate rounds of 50, so that both
// meet the same moments of a machine shared with other work, and returns
// the percentiles of each. It fails when either has no connection that
// succeeded.
func ConnectBoth(targets, direct []string, n int, timeout time.Duration) (through, routed Latency, err error) {
	const round = 50
	var tt, rt []float64
	var tf, rf int
	for done := 0; done < n; done += round {
		k := min(round, n-done)
		t, f := ConnectTimes(direct, k, timeout)
		rt, rf = append(rt, t...), rf+f
		t, f = ConnectTimes(targets, k, timeout)
		tt, tf = append(tt, t...), tf+f
	}
	if routed, err = Percentiles(rt, rf); err != nil {
		return through, routed, fmt.Errorf("direct: %w", err)
	}
	if through, err = Percentiles(tt, tf); err != nil {
		return through, routed, fmt.Errorf("through the services: %w", err)
	}
	return through, routed, nil
}

// ConnectTimes opens n TCP connections, round robin over targets, and
// returns the time of each that succeeded, in microseconds, and how many
// failed. Each connection ends with a reset, which leaves no TIME_WAIT
// behind, so that a long probe does not run out of ports.
func ConnectTimes(targets []string, n int, timeout time.Duration) ([]float64, int) {
	var times []float64
	failed := 0
	for i := range n {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp", targets[i%len(targets)], timeout)
		el := time.Since(t0)
		if err != nil {
			failed++
			continue
		}
		times = append(times, float64(el.Nanoseconds())/1e3)
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	return times, failed
}

// Percentiles summarises connect times (µs); it fails when there are
// none.
func Percentiles(times []float64, failed int) (Latency, error) {
	if len(times) == 0 {
		return Latency{Failed: failed}, fmt.Errorf("no connection succeeded (%d failed)", failed)
	}
	s := slices.Clone(times)
	slices.Sort(s)
	pct := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return Latency{P50: pct(0.50), P99: pct(0.99), N: len(s), Failed: failed}, nil
}
