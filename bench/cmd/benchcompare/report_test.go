package main

import (
	"strings"
	"testing"
)

// TestFirstPacketOverDirect: the flatness of the first packet takes each
// size's time through the services over the direct time of the same
// probe, so that a machine busier during one size than the other moves
// both alike.
func TestFirstPacketOverDirect(t *testing.T) {
	nft := proxier{"kproxy", "nftables"}
	rep := &report{Results: []*result{
		{Proxier: nft, N: 1000, M: 10, Connect: &latency{P50: 40, P99: 100, N: 1000}, Direct: &latency{P50: 50, P99: 110, N: 1000}},
		// The machine was twice as slow: both paths doubled.
		{Proxier: nft, N: 50000, M: 5, Connect: &latency{P50: 84, P99: 200, N: 1000}, Direct: &latency{P50: 100, P99: 220, N: 1000}},
	}}
	md := rep.markdown()
	for _, want := range []string{
		"kproxy nftables, 50k services against 1k: p50 2.10x, p99 2.00x; each over the direct path's in the same probe, p50 1.05x, p99 1.00x.",
		"| nftables first packet p50 over the direct path's, 50k x 5 over 1k x 10 | at most 1.1 | 1.05 | yes |",
		"| nftables first packet p99 over the direct path's, 50k x 5 over 1k x 10 | at most 1.1 | 1.00 | yes |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	// iptables' direct path crosses its rules: the raw ratio, and the
	// direct path's growth.
	ipt := proxier{"kproxy", "iptables"}
	rep.Results = append(rep.Results,
		&result{Proxier: ipt, N: 1000, M: 10, Connect: &latency{P50: 50, P99: 100, N: 1000}, Direct: &latency{P50: 60, P99: 120, N: 1000}},
		&result{Proxier: ipt, N: 50000, M: 5, Connect: &latency{P50: 300, P99: 900, N: 1000}, Direct: &latency{P50: 1500, P99: 3000, N: 1000}})
	if md := rep.markdown(); !strings.Contains(md, "kproxy iptables, 50k services against 1k: p50 6.00x, p99 9.00x; its direct connects cross the same rules, and grew p50 25.00x.") {
		t.Errorf("iptables' first packet:\n%s", md)
	}
	rep.Results[1].Direct = nil
	if md := rep.markdown(); !strings.Contains(md, "| nftables first packet p50 over the direct path's, 50k x 5 over 1k x 10 | at most 1.1 | not measured | - |") {
		t.Errorf("a size without its direct time is measured:\n%s", md)
	}
}

// TestKernelShare: the report sets each kproxy nftables sync beside the
// kernel's commit of its batches, replayed, and the change beside the
// cheapest element commit.
func TestKernelShare(t *testing.T) {
	rep := &report{Results: []*result{{Proxier: proxier{"kproxy", "nftables"}, N: 1000, M: 10,
		Cold: 60, Change: []float64{0.05, 0.06, 0.07}, ElementFloor: 0.015,
		ColdAgain: 62, ColdReplay: 50, ChangeAgain: 0.056, ChangeReplay: 0.028}}}
	md := rep.markdown()
	want := "| 1k x 10 | 62 ms / 50 ms, 1.24x | 56 µs / 28 µs, 2.00x | 15 µs | 4.00x |"
	if !strings.Contains(md, want) {
		t.Errorf("report lacks %q:\n%s", want, md)
	}
	rep.Results[0].ColdReplay = 0
	if md := rep.markdown(); strings.Contains(md, "The kernel's share") {
		t.Errorf("a report without floors has their section:\n%s", md)
	}
}

// TestChangeByEdit: the report gives kproxy's one-endpoint change made by
// State.Edit beside the Builder's, at each size, and its growth from 1k x
// 10 to 50k x 5 as a target; kube-proxy has no such path.
func TestChangeByEdit(t *testing.T) {
	nft := proxier{"kproxy", "nftables"}
	rep := &report{Results: []*result{
		{Proxier: proxier{"kube-proxy", "nftables"}, N: 1000, M: 10, Cold: 200, Change: []float64{180}},
		{Proxier: nft, N: 1000, M: 10, Cold: 60, Change: []float64{0.05}, ChangeEdit: []float64{0.08, 0.1, 0.12}},
		{Proxier: nft, N: 50000, M: 5, Cold: 3000, Change: []float64{0.4}, ChangeEdit: []float64{0.3}},
	}}
	md := rep.markdown()
	for _, want := range []string{
		"| one endpoint change by State.Edit, with the edit, median | - | 0.10 ms | - |",
		"| one endpoint change by State.Edit, with the edit, median | - | 0.30 ms | - |",
		"| nftables one endpoint change by State.Edit (median, with the edit), 50k x 5 over 1k x 10 | at most 2 | 3.00 | no |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
