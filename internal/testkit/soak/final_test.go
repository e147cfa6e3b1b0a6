//go:build soak

package soak

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// diffLinesShown bounds the lines of each side the report of a differing
// final state shows.
const diffLinesShown = 40

// compareFinal compares the node's kernel state with a fresh proxier's
// apply of the final desired state in a new namespace, and reports
// whether they are equal; it logs how they differ.
func (s *soak) compareFinal() bool {
	t := s.t
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	got, err := s.dp.canonical(ctx, s.tp.Node)
	if err != nil {
		t.Errorf("soak: read the node's state: %v", err)
		return false
	}
	want, err := s.freshState(ctx)
	if err != nil {
		t.Errorf("soak: fresh apply: %v", err)
		return false
	}
	if got == want {
		return true
	}
	missing, extra := lineDiff(want, got)
	t.Logf("soak: the node's state differs from a fresh apply: %d lines missing, %d extra", len(missing), len(extra))
	if len(missing)+len(extra) == 0 {
		w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
		i := 0
		for i < len(w) && w[i] == g[i] {
			i++
		}
		t.Logf("  the same lines in another order, from line %d: fresh %q, node %q", i+1, w[i], g[i])
	}
	for _, l := range missing[:min(len(missing), diffLinesShown)] {
		t.Logf("  - %s", l)
	}
	for _, l := range extra[:min(len(extra), diffLinesShown)] {
		t.Logf("  + %s", l)
	}
	return false
}

// freshState applies the final desired state with a new proxier of the
// backend in a namespace of its own, and reads it back.
func (s *soak) freshState(ctx context.Context) (string, error) {
	h := netnstest.NewHost(s.t, "fresh")
	p, err := newBackend(s.dp.name(), h.NS, 0, nil)
	if err != nil {
		return "", err
	}
	defer p.Close()
	st, err := servicelb.NewState(s.node, s.world.services()...)
	if err != nil {
		return "", err
	}
	start := time.Now()
	if err := servicetest.SyncErr(p.Sync(ctx, st)); err != nil {
		return "", fmt.Errorf("sync: %w", err)
	}
	s.t.Logf("soak: fresh apply of the final state took %v", time.Since(start).Round(time.Millisecond))
	return s.dp.canonical(ctx, h)
}
