//go:build linux

package iptables

import (
	"context"
	"sync"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/xtables"
)

// countingConn counts what passes through a Conn and keeps the last batch.
type countingConn struct {
	xtables.Conn
	mu      sync.Mutex
	batches int
	dumps   int
	last    string
}

func (c *countingConn) Commit(ctx context.Context, b *nfnl.Batch) (nfnl.Generation, error) {
	c.mu.Lock()
	c.batches++
	c.last = b.String()
	c.mu.Unlock()
	return c.Conn.Commit(ctx, b)
}

func (c *countingConn) EachRule(ctx context.Context, fam nfnl.Family, table, chain string, each func(*nfnl.Rule) error) error {
	c.mu.Lock()
	c.dumps++
	c.mu.Unlock()
	return c.Conn.EachRule(ctx, fam, table, chain, each)
}

// newApplier rebuilds px's applier on conn.
func newApplier(px *Proxier, conn xtables.Conn) *xtables.Applier {
	return xtables.NewApplier(xtables.ApplierOptions{
		Conn: conn,
		Owns: func(_ xtables.TableName, chain string) bool { return px.n.owns(chain) },
	})
}
