//go:build linux

package nfnl

import (
	"context"
	"fmt"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

type tapKey struct{}

// WithTap returns a context under which every Commit calls tap with the
// batch exactly as it goes to the kernel (BATCH_BEGIN to BATCH_END), before
// sending it (a batch the Conn sends from several buffers is joined into
// one for the tap). The bytes are valid only during the call. Benchmarks use it
// to replay a proxier's batches (Conn.Replay) and so measure the kernel's
// own cost of a commit apart from the work of building it; like
// net/http/httptrace, it changes nothing else.
func WithTap(ctx context.Context, tap func(frame []byte)) context.Context {
	return context.WithValue(ctx, tapKey{}, tap)
}

func tapOf(ctx context.Context) func([]byte) {
	t, _ := ctx.Value(tapKey{}).(func([]byte))
	return t
}

type requestsKey struct{}

// Request is the kind of a request a Conn sends to the kernel.
type Request int

// The kinds of requests.
const (
	// RequestCommit is a batch, with the generation read that follows it
	// on the same socket (Conn.Commit).
	RequestCommit Request = iota
	// RequestGeneration is a read of the ruleset generation alone
	// (Conn.Generation).
	RequestGeneration
	// RequestRead reads objects: a table, or a dump of chains, rules,
	// sets or elements.
	RequestRead
)

// String names the kind: "commit", "generation" or "read".
func (r Request) String() string {
	switch r {
	case RequestCommit:
		return "commit"
	case RequestGeneration:
		return "generation"
	}
	return "read"
}

// WithRequests returns a context under which a Conn calls f with the kind
// of each request it sends, before sending it: each is one round trip to
// the kernel. Tests count with it what a call costs; like WithTap, it
// changes nothing else.
func WithRequests(ctx context.Context, f func(Request)) context.Context {
	return context.WithValue(ctx, requestsKey{}, f)
}

// traceRequest tells ctx's WithRequests function, if any, of a request.
func traceRequest(ctx context.Context, r Request) {
	if f, _ := ctx.Value(requestsKey{}).(func(Request)); f != nil {
		f(r)
	}
}

// Replay sends a batch captured by a tap as it was, less any generation
// check in its BATCH_BEGIN (the generation differs in another namespace),
// and waits for the kernel's answer: an error names the first message the
// kernel refused, by its errno.
func (c *Conn) Replay(ctx context.Context, frame []byte) error {
	if len(frame) < nl.HeaderLen+nfgenLen {
		return fmt.Errorf("nfnl: replay: short batch")
	}
	first := nl.LengthOf(frame)
	if first < nl.HeaderLen+nfgenLen || first > len(frame) {
		return fmt.Errorf("nfnl: replay: malformed batch")
	}
	p := slices.Concat(frame[:nl.HeaderLen+nfgenLen], frame[nl.Align(first):])
	nl.PutLength(p[:nl.HeaderLen+nfgenLen])
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if err := c.s.Write(ctx, p); err != nil {
		return err
	}
	probe := c.s.NextSeq(1)
	if err := c.sendGetGen(ctx, probe); err != nil {
		return err
	}
	for {
		msgs, err := c.s.Read(ctx)
		if err != nil {
			return err
		}
		var refused error
		for _, m := range msgs {
			if m.Type == nl.TypeError {
				if errno, _, _ := errorOf(m); errno != 0 && refused == nil {
					refused = fmt.Errorf("nfnl: replay: message %d: %w", m.Seq, errno)
				}
				continue
			}
			if m.Seq == probe && m.Type == subsysNFTables<<8|msgNewGen {
				return refused
			}
		}
		if refused != nil {
			return refused
		}
	}
}
