package main

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"
)

// proxier is one side of the comparison.
type proxier struct {
	Impl    string // "kube-proxy" or "kproxy"
	Backend string // "nftables" or "iptables"
}

func (p proxier) label() string { return p.Impl + " " + p.Backend }

var proxiers = []proxier{
	{"kube-proxy", "nftables"}, {"kproxy", "nftables"},
	{"kube-proxy", "iptables"}, {"kproxy", "iptables"},
}

// result is what one proxier measured at one size. Times in ms, memory
// in MiB, connect times in µs; zero is not measured.
type result struct {
	Proxier proxier
	N, M    int
	Err     string `json:",omitempty"` // why the run stopped early
	Bounded bool   // a sync did not finish within the bound
	Cold    float64
	Change  []float64
	// ChangeEdit are one-endpoint changes made by State.Edit (kproxy
	// only), each timed with its edit.
	ChangeEdit []float64 `json:",omitempty"`
	Add, Del   []float64
	PeakMiB    float64 // VmHWM after the cold sync
	SteadyMiB  float64 // VmRSS after the changes, once the Go heap is returned
	Adopt      float64
	Connect    *latency `json:",omitempty"` // through a service's address
	Direct     *latency `json:",omitempty"` // to an endpoint, routed by the node
	// kproxy only: the kernel's floors.
	ElementFloor float64 // median element commit in the loaded namespace
	ColdReplay   float64 // the cold sync's batches replayed in an empty namespace
	ColdAgain    float64 // the cold sync made again, in an empty namespace
	// One-endpoint changes made again over the same state in a namespace
	// of their own (median), and their batches replayed over the same
	// table in another (median).
	ChangeAgain, ChangeReplay float64
}

type latency struct {
	P50 float64 `json:"p50_us"`
	P99 float64 `json:"p99_us"`
	N   int     `json:"n"`
}

func (r *result) size() size { return size{r.N, r.M} }

func (r *result) summary() string {
	if r.Cold == 0 {
		return "cold sync: " + r.Err
	}
	s := fmt.Sprintf("cold %s, change p50 %s, adopt %s, peak %.0f MiB, steady %.0f MiB",
		ms(r.Cold), ms(pct(r.Change, 50)), ms(r.Adopt), r.PeakMiB, r.SteadyMiB)
	if r.Connect != nil {
		s += fmt.Sprintf(", connect p50 %.0f µs", r.Connect.P50)
	}
	if r.Err != "" {
		s += "; " + r.Err
	}
	return s
}

func (c config) driver(pr proxier, sz size) []string {
	args := []string{"-backend", pr.Backend, "-services", strconv.Itoa(sz.n), "-endpoints", strconv.Itoa(sz.m)}
	if pr.Impl == "kproxy" {
		return append([]string{c.kproxy, "run"}, args...)
	}
	return append([]string{c.kubeProxy}, args...)
}

// measure runs one proxier at one size in a topology of its own.
func (c config) measure(pr proxier, sz size) *result {
	r := &result{Proxier: pr, N: sz.n, M: sz.m}
	all := benchwork.Generate(sz.n, sz.m)
	var probedEPs []netip.Addr
	var vips, direct []string
	for _, i := range benchwork.Probed(sz.n) {
		vips = append(vips, netip.AddrPortFrom(all[i].VIP, 80).String())
		for _, e := range all[i].Endpoints {
			probedEPs = append(probedEPs, e.Addr)
			if len(direct) < 3 {
				direct = append(direct, netip.AddrPortFrom(e.Addr, 8080).String())
			}
		}
	}
	want := benchwork.Digest(all)
	all = nil
	t, err := newTopo(probedEPs)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer t.close()
	if err := c.first(r, t, pr, sz, want, vips, direct); err != nil {
		r.Err = err.Error()
		r.Bounded = errors.Is(err, errBound)
		return r
	}
	if err := c.adopt(r, t, pr, sz); err != nil {
		r.Err = "restart: " + err.Error()
		r.Bounded = errors.Is(err, errBound)
	}
	return r
}

// first is the first process: cold sync, changes, services, memory,
// the data path, the floors; it leaves its table for the second.
func (c config) first(r *result, t *topo, pr proxier, sz size, want string, vips, direct []string) error {
	fmt.Fprintf(c.log, "=== %s %s\n", pr.label(), sz)
	p, err := start(t.node, c.log, c.driver(pr, sz)...)
	if err != nil {
		return err
	}
	defer p.quit()
	var hello struct{ Digest string }
	if err := p.read(c.bound, &hello); err != nil {
		return err
	}
	if hello.Digest != want {
		return fmt.Errorf("the driver's workload differs (digest %s, want %s)", hello.Digest, want)
	}
	var mem struct {
		MS     float64 `json:"ms"`
		HWMKiB float64 `json:"hwm_kib"`
		RSSKiB float64 `json:"rss_kib"`
	}
	if err := p.ask(c.bound, &mem, "sync"); err != nil {
		return fmt.Errorf("cold sync: %w", err)
	}
	r.Cold, r.PeakMiB = mem.MS, mem.HWMKiB/1024
	var ch struct{ MS []float64 }
	budget := strconv.Itoa(int(c.changeBudget.Milliseconds()))
	if err := p.ask(c.bound+c.changeBudget, &ch, "change", strconv.Itoa(c.changes), budget); err != nil {
		return fmt.Errorf("change: %w", err)
	}
	r.Change = ch.MS
	if pr.Impl == "kproxy" {
		if err := p.ask(c.bound+c.changeBudget, &ch, "change-edit", strconv.Itoa(c.changes), budget); err != nil {
			return fmt.Errorf("change by State.Edit: %w", err)
		}
		r.ChangeEdit = ch.MS
	}
	var sv struct {
		Add []float64 `json:"add_ms"`
		Del []float64 `json:"delete_ms"`
	}
	if err := p.ask(2*c.bound+c.changeBudget, &sv, "service", strconv.Itoa(c.services), budget); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	r.Add, r.Del = sv.Add, sv.Del
	if err := p.ask(c.bound, &mem, "mem"); err != nil {
		return err
	}
	r.SteadyMiB = mem.RSSKiB / 1024
	if err := c.dataPath(r, t, vips, direct); err != nil {
		return fmt.Errorf("data path: %w", err)
	}
	if pr.Impl == "kproxy" {
		var fe struct{ MS float64 }
		if err := p.ask(c.bound, &fe, "floor-element", "200"); err != nil {
			return fmt.Errorf("element floor: %w", err)
		}
		r.ElementFloor = fe.MS
		var fc struct {
			Sync   float64 `json:"sync_ms"`
			Replay float64 `json:"replay_ms"`
		}
		if err := p.ask(2*c.bound, &fc, "floor-cold"); err != nil {
			return fmt.Errorf("cold floor: %w", err)
		}
		r.ColdAgain, r.ColdReplay = fc.Sync, fc.Replay
		if pr.Backend == "nftables" {
			if err := p.ask(2*c.bound+2*c.changeBudget, &fc, "floor-change", strconv.Itoa(c.changes), budget); err != nil {
				return fmt.Errorf("change floor: %w", err)
			}
			r.ChangeAgain, r.ChangeReplay = fc.Sync, fc.Replay
		}
	}
	return nil
}

func (c config) dataPath(r *result, t *topo, vips, direct []string) error {
	if t.server == nil {
		if err := t.serve(c.kproxy, c.log); err != nil {
			return err
		}
	}
	// One probe connects through the services and directly in turn, so
	// that the two meet the same moments of the machine.
	var both struct{ Connect, Direct *latency }
	if err := run(t.client, c.log, &both, c.kproxy, "probe", "-n", strconv.Itoa(c.probes),
		"-targets", strings.Join(vips, ","), "-direct", strings.Join(direct, ",")); err != nil {
		return err
	}
	r.Connect, r.Direct = both.Connect, both.Direct
	return nil
}

// adopt is a new process over the full table the first one left: its
// first sync.
func (c config) adopt(r *result, t *topo, pr proxier, sz size) error {
	fmt.Fprintf(c.log, "=== %s %s (restart)\n", pr.label(), sz)
	p, err := start(t.node, c.log, c.driver(pr, sz)...)
	if err != nil {
		return err
	}
	defer p.quit()
	var hello struct{ Digest string }
	if err := p.read(c.bound, &hello); err != nil {
		return err
	}
	var res struct{ MS float64 }
	if err := p.ask(c.bound, &res, "sync"); err != nil {
		return err
	}
	r.Adopt = res.MS
	return nil
}

// pct is the p-th percentile of s (nearest rank), 0 for none.
func pct(s []float64, p float64) float64 {
	if len(s) == 0 {
		return 0
	}
	s = slices.Clone(s)
	slices.Sort(s)
	return s[min(len(s)-1, int(p/100*float64(len(s))))]
}

func ms(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 1:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}
