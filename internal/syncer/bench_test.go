package syncer

import (
	"context"
	"fmt"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// leaveOne is a backend that takes every state but refuses one service,
// with an error naming it, as a capability check does.
type leaveOne struct{ name string }

func (leaveOne) Check(context.Context) (bool, error)  { return true, nil }
func (leaveOne) Verify(context.Context) (bool, error) { return true, nil }
func (l leaveOne) Write(_ context.Context, st *servicelb.State) error {
	return l.refuse(st)
}
func (l leaveOne) Apply(_ context.Context, st *servicelb.State, _ *servicelb.Changes) (bool, error) {
	return false, l.refuse(st)
}
func (l leaveOne) refuse(st *servicelb.State) error {
	if _, ok := st.Service(l.name); ok {
		return &servicelb.ValidationError{Service: l.name, Field: "ports", Err: servicelb.ErrUnsupported}
	}
	return nil
}

// BenchmarkSyncWithAServiceLeftOut: one endpoint change, synced while one
// service of n stays left out, costs what changed (and the one service),
// not a walk of the n services.
func BenchmarkSyncWithAServiceLeftOut(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs := servicetest.Scale(n, 10)
			bld, err := servicelb.NewBuilder(servicetest.ScaleNode())
			if err != nil {
				b.Fatal(err)
			}
			for _, s := range svcs {
				if err := bld.Upsert(s); err != nil {
					b.Fatal(err)
				}
			}
			e := New(leaveOne{name: svcs[0].Name}, Options{Name: "bench"})
			ctx := context.Background()
			rep, err := e.Sync(ctx, bld.State())
			if err != nil || len(rep.LeftOut) != 1 {
				b.Fatalf("first sync: %v, left out %v", err, rep.LeftOut)
			}
			i := 0
			for b.Loop() {
				i++
				if err := bld.Upsert(servicetest.ReplaceEndpoint(svcs[1+i%(n-1)], i)); err != nil {
					b.Fatal(err)
				}
				rep, err := e.Sync(ctx, bld.State())
				if err != nil || len(rep.LeftOut) != 1 || rep.Applied.Len() != n-1 {
					b.Fatalf("sync %d: %v, left out %v", i, err, rep.LeftOut)
				}
			}
		})
	}
}
