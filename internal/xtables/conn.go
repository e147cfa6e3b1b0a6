//go:build linux

package xtables

import (
	"context"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// Conn carries nf_tables messages to the kernel of one network namespace:
// an *nfnl.Conn, or a wrapper around one.
type Conn interface {
	// Generation returns the current ruleset generation.
	Generation(ctx context.Context) (nfnl.Generation, error)
	// Commit applies a batch as one transaction.
	Commit(ctx context.Context, b *nfnl.Batch) (nfnl.Generation, error)
	// Tables lists the tables of a family.
	Tables(ctx context.Context, fam nfnl.Family) ([]nfnl.Table, error)
	// Chains lists the chains of a table.
	Chains(ctx context.Context, fam nfnl.Family, table string) ([]nfnl.Chain, error)
	// EachRule calls each for the rules of a table (or of one chain), in
	// order, expressions undecoded, valid only during the call.
	EachRule(ctx context.Context, fam nfnl.Family, table, chain string, each func(*nfnl.Rule) error) error
}

var _ Conn = (*nfnl.Conn)(nil)

// ErrGenChanged reports a batch refused because someone else changed the
// ruleset since the generation it was built for.
var ErrGenChanged = nfnl.ErrGenerationChanged
