package iptables

import (
	"context"
	"sync"

	"github.com/kproxy-dev/kproxy/internal/xtables"
)

// countingConn counts what passes through a Conn.
type countingConn struct {
	xtables.Conn
	mu      sync.Mutex
	batches int
	dumps   int
}

func (c *countingConn) Batch(ctx context.Context, body []byte, gen uint32) ([][]byte, error) {
	c.mu.Lock()
	c.batches++
	c.mu.Unlock()
	return c.Conn.Batch(ctx, body, gen)
}

func (c *countingConn) Dump(ctx context.Context, req []byte) ([][]byte, error) {
	c.mu.Lock()
	c.dumps++
	c.mu.Unlock()
	return c.Conn.Dump(ctx, req)
}

// newApplier rebuilds px's applier on conn.
func newApplier(px *Proxier, conn xtables.Conn) *xtables.Applier {
	return xtables.NewApplier(xtables.ApplierOptions{
		Conn: conn,
		Owns: func(_ xtables.TableName, chain string) bool { return px.n.owns(chain) },
	})
}
