//go:build linux

package iptables

import (
	"context"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// emptyKernel is a Conn to an empty ruleset that accepts every batch and
// applies nothing: for measuring the work done before the kernel.
type emptyKernel struct{ offlineConn }

func (emptyKernel) Generation(context.Context) (nfnl.Generation, error) {
	return nfnl.Generation{ID: 1}, nil
}

func (emptyKernel) Commit(context.Context, *nfnl.Batch) (nfnl.Generation, error) {
	return nfnl.Generation{ID: 2}, nil
}

func (emptyKernel) Tables(context.Context, nfnl.Family) ([]nfnl.Table, error) { return nil, nil }

// BenchmarkBuildCold measures a first sync of n services of 10 endpoints
// up to the kernel: planning, encoding and building the batch.
func BenchmarkBuildCold(b *testing.B) {
	st := bigState(b, benchSize())
	b.ResetTimer()
	for range b.N {
		px, err := New(Options{Families: []servicelb.Family{servicelb.IPv4}, NoConntrackCleanup: true, conn: emptyKernel{}})
		if err != nil {
			b.Fatal(err)
		}
		if err := servicetest.SyncErr(px.Sync(context.Background(), st)); err != nil {
			b.Fatal(err)
		}
	}
}
