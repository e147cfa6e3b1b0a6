//go:build linux

package netnstest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// Churn runs another writer of nf_tables in the host until the test ends:
// every interval it commits a change to a table of its own (a chain added,
// then deleted again), as a firewall manager or a CNI plugin on a node
// does, with the nft tool. Each commit moves the ruleset's generation and
// interrupts dumps under way, whatever table they read. It returns a
// function that counts the commits so far.
func (h *Host) Churn(t testing.TB, interval time.Duration) func() int {
	t.Helper()
	h.Exec(t, "nft", "add", "table", "inet", "kpt-churn")
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		verb := "add"
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := h.Output(ctx, "", "nft", verb, "chain", "inet", "kpt-churn", "c"); err == nil {
				n.Add(1)
			}
			verb = map[string]string{"add": "delete", "delete": "add"}[verb]
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return func() int { return int(n.Load()) }
}

// Flood is Churn at rates no tool reaches: it commits through a netlink
// socket of its own, pausing only pause after each commit. It returns a
// function that counts the commits so far.
func (h *Host) Flood(t testing.TB, pause time.Duration) func() int {
	t.Helper()
	c, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	if err != nil {
		t.Fatal(err)
	}
	const table = "kpt-flood"
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		b := &nfnl.Batch{}
		b.AddTable(nfnl.Table{Family: nfnl.Inet, Name: table})
		if _, err := c.Commit(ctx, b); err != nil {
			t.Errorf("flood: add table: %v", err)
			return
		}
		for add := true; ctx.Err() == nil; add = !add {
			b := &nfnl.Batch{}
			if add {
				b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: table, Name: "c"})
			} else {
				b.DelChain(nfnl.Inet, table, "c")
			}
			if _, err := c.Commit(ctx, b); err == nil {
				n.Add(1)
			}
			time.Sleep(pause)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = c.Close()
	})
	return func() int { return int(n.Load()) }
}
