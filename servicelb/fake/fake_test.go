package fake

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func TestClock(t *testing.T) {
	start := time.Unix(1000, 0)
	c := NewClock(start)
	t1 := c.NewTimer(time.Second)
	t2 := c.NewTimer(3 * time.Second)
	now := c.NewTimer(0)
	ctx := context.Background()
	for _, want := range []time.Time{start.Add(time.Second), start.Add(3 * time.Second), start} {
		if at, err := c.NextTimer(ctx); err != nil || !at.Equal(want) {
			t.Fatalf("NextTimer = %s, %v; want %s", at, err, want)
		}
	}
	select {
	case <-now.C():
	default:
		t.Fatal("a zero timer did not fire at once")
	}
	c.Advance(2 * time.Second)
	select {
	case <-t1.C():
	default:
		t.Fatal("a due timer did not fire")
	}
	if !t2.Stop() {
		t.Fatal("Stop of a pending timer returned false")
	}
	c.Advance(time.Hour)
	select {
	case <-t2.C():
		t.Fatal("a stopped timer fired")
	default:
	}
	if !c.Now().Equal(start.Add(time.Hour + 2*time.Second)) {
		t.Fatalf("Now = %s", c.Now())
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.NextTimer(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("NextTimer after cancel: %v", err)
	}
}

func TestProxier(t *testing.T) {
	var p Proxier
	ctx := context.Background()
	svc := servicelb.Service{Name: "a", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		Ports: []servicelb.Port{{Protocol: servicelb.UDP, Port: 53}}}
	st, err := servicelb.NewState(servicelb.NodeConfig{}, svc)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	p.FailNext(boom)
	if err := servicetest.SyncErr(p.Sync(ctx, st)); !errors.Is(err, boom) || p.Applied() != nil {
		t.Fatalf("failing Sync: %v, applied %v", err, p.Applied())
	}
	if err := servicetest.SyncErr(p.Sync(ctx, st)); err != nil || p.Applied() != st {
		t.Fatalf("Sync: %v", err)
	}
	recs, err := p.WaitSyncs(ctx, 2)
	if err != nil || len(recs) != 2 || recs[1].Changes.Len() != 1 || recs[0].Err == nil {
		t.Fatalf("records %+v, %v", recs, err)
	}
	out, _ := p.Render(st)
	if want := "a:/ipv4 udp 10.0.0.1:53 -> (reject)\n"; out != want {
		t.Errorf("Render = %q, want %q", out, want)
	}
	if err := p.Cleanup(ctx); err != nil || p.Cleanups() != 1 || p.Applied() != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := p.WaitSyncs(wctx, 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitSyncs past the records: %v", err)
	}
}
