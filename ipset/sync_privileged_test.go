//go:build privileged || vm

package ipset_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/ipset"
)

// recorder records the requests a client sends.
type recorder struct{ sent []string }

func record(c *ipset.Client) *recorder {
	r := &recorder{}
	ipset.Observe(c, func(cmd string, n int) { r.sent = append(r.sent, fmt.Sprintf("%s %d", cmd, n)) })
	return r
}

func (r *recorder) take() []string {
	s := r.sent
	r.sent = nil
	return s
}

func ipPort(addr string, port uint16) ipset.Entry {
	return ipset.Entry{IP: ip(addr), Protocol: tcp, Port: port}
}

// TestSyncSendsOnlyTheDifference counts the requests Sync sends and
// checks, through the kernel's running timeouts, that entries present
// before and after were never re-added.
func TestSyncSendsOnlyTheDifference(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	if err := c.Create(ctx, ipset.Set{Name: "SVC", Type: ipset.HashIPPort, Family: ipset.IPv4, Timeout: 600 * time.Second}); err != nil {
		t.Fatal(err)
	}
	rec := record(c)
	a, b, cc, d := ipPort("10.96.0.1", 80), ipPort("10.96.0.2", 80), ipPort("10.96.0.3", 443), ipPort("10.96.0.4", 53)
	res, err := c.Sync(ctx, "SVC", []ipset.Entry{a, b, cc, b})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"list 0", "add 3"}, rec.take()); diff != "" {
		t.Errorf("first Sync sent (-want +got):\n%s", diff)
	}
	if res != (ipset.SyncResult{Added: 3}) {
		t.Errorf("first Sync: %+v", res)
	}

	time.Sleep(2100 * time.Millisecond) // let the kernel's timeouts run down by two seconds
	res, err = c.Sync(ctx, "SVC", []ipset.Entry{b, cc, d})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"list 0", "add 1", "del 1"}, rec.take()); diff != "" {
		t.Errorf("second Sync sent (-want +got; the add must come before the delete):\n%s", diff)
	}
	if res != (ipset.SyncResult{Added: 1, Deleted: 1}) {
		t.Errorf("second Sync: %+v", res)
	}
	_, got, err := c.Entries(ctx, "SVC")
	if err != nil {
		t.Fatal(err)
	}
	remaining := make(map[string]time.Duration)
	for _, e := range got {
		remaining[e.String()] = e.Timeout
	}
	if len(remaining) != 3 || remaining[a.String()] != 0 {
		t.Fatalf("set holds %v, want %v, %v, %v", remaining, b, cc, d)
	}
	for _, kept := range []ipset.Entry{b, cc} {
		if r := remaining[kept.String()]; r > 598*time.Second {
			t.Errorf("kept entry %v has %v left: its timeout was reset, so it was sent again", kept, r)
		}
	}
	if r := remaining[d.String()]; r < 599*time.Second {
		t.Errorf("new entry %v has %v left, want a fresh 600s", d, r)
	}

	rec.take()
	if _, err := c.Sync(ctx, "SVC", []ipset.Entry{d, cc, b}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"list 0"}, rec.take()); diff != "" {
		t.Errorf("unchanged Sync sent (-want +got):\n%s", diff)
	}
}

func TestSyncComment(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	if err := c.Create(ctx, ipset.Set{Name: "C", Type: ipset.HashIP, Family: ipset.IPv6, Comment: true}); err != nil {
		t.Fatal(err)
	}
	e := ipset.Entry{IP: ip("fd00::1"), Comment: "old"}
	if _, err := c.Sync(ctx, "C", []ipset.Entry{e}); err != nil {
		t.Fatal(err)
	}
	e.Comment = "new"
	res, err := c.Sync(ctx, "C", []ipset.Entry{e})
	if err != nil || res != (ipset.SyncResult{Added: 1}) {
		t.Fatalf("Sync with a new comment: %+v, %v", res, err)
	}
	if out := h.Exec(t, "ipset", "save", "KPT-C"); !strings.Contains(out, `add KPT-C fd00::1 comment "new"`) {
		t.Errorf("ipset save:\n%s", out)
	}
	dup := []ipset.Entry{e, {IP: ip("fd00::1"), Comment: "other"}}
	if _, err := c.Sync(ctx, "C", dup); !errors.Is(err, ipset.ErrInvalid) {
		t.Errorf("Sync with conflicting duplicates: %v, want ErrInvalid", err)
	}
	if _, err := c.Sync(ctx, "MISSING", nil); !errors.Is(err, ipset.ErrNotExist) {
		t.Errorf("Sync of a missing set: %v, want ErrNotExist", err)
	}
}

// TestSyncLarge moves a big set in batches and checks the result with
// `ipset save`.
func TestSyncLarge(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	if err := c.Create(ctx, ipset.Set{Name: "BIG", Type: ipset.HashIPPortNet, Family: ipset.IPv4, MaxElem: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	entries := func(from, to int) []ipset.Entry {
		var out []ipset.Entry
		for i := from; i < to; i++ {
			out = append(out, ipset.Entry{IP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Protocol: tcp, Port: 80,
				Net: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(i >> 8), 0}), 24)})
		}
		return out
	}
	rec := record(c)
	if _, err := c.Sync(ctx, "BIG", entries(0, 5000)); err != nil {
		t.Fatal(err)
	}
	adds := 0
	for _, s := range rec.take() {
		if strings.HasPrefix(s, "add ") {
			adds++
		}
	}
	if adds < 2 || adds > 20 {
		t.Errorf("5000 entries went in %d add messages, want a few batches", adds)
	}
	res, err := c.Sync(ctx, "BIG", entries(2500, 7500))
	if err != nil || res != (ipset.SyncResult{Added: 2500, Deleted: 2500}) {
		t.Fatalf("second Sync: %+v, %v", res, err)
	}
	out := h.Exec(t, "ipset", "save", "KPT-BIG")
	if n := strings.Count(out, "\nadd "); n != 5000 {
		t.Errorf("ipset save lists %d entries, want 5000", n)
	}
	for _, want := range []string{"add KPT-BIG 10.96.9.196,tcp:80,192.168.9.0/24", "add KPT-BIG 10.96.29.75,tcp:80,192.168.29.0/24"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("ipset save lacks %q", want)
		}
	}
	if strings.Contains(out, "add KPT-BIG 10.96.9.195,") {
		t.Error("ipset save still holds an entry Sync deleted (10.96.9.195 is entry 2499)")
	}
}

// TestSyncRandomStates walks a set through random desired states; after
// each Sync the kernel holds exactly the desired entries (with their
// comments), as a fresh set filled with them would.
func TestSyncRandomStates(t *testing.T) {
	netnstest.Require(t, "ipset")
	h := netnstest.NewHost(t, "node")
	c := newClient(t, h, "KPT-")
	ctx := t.Context()
	set := ipset.Set{Name: "WALK", Type: ipset.HashIPPortIP, Family: ipset.IPv4, Comment: true}
	if err := c.Create(ctx, set); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pool := make([]ipset.Entry, 40)
	for i := range pool {
		pool[i] = ipset.Entry{IP: netip.AddrFrom4([4]byte{10, 96, 0, byte(i % 8)}), Protocol: []ipset.Protocol{tcp, udp, sctp}[i%3],
			Port: uint16(80 + i/8), IP2: netip.AddrFrom4([4]byte{10, 244, 1, byte(i)})}
	}
	for step := range 25 {
		var desired []ipset.Entry
		for _, e := range pool {
			if rng.IntN(3) == 0 {
				e.Comment = []string{"", "a", "b"}[rng.IntN(3)]
				desired = append(desired, e)
			}
		}
		if _, err := c.Sync(ctx, set.Name, desired); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		fresh, err := ipset.Restore("KPT-", set, desired)
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Split(strings.TrimSpace(fresh), "\n")[1:]
		sort.Strings(want)
		_, got := saveLines(t, h, "KPT-WALK")
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("step %d: kernel differs from the desired state (-want +got):\n%s", step, diff)
		}
	}
}
