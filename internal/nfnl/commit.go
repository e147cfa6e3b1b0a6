//go:build linux

package nfnl

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"syscall"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// Commit sends the batch as one transaction and waits for the kernel's
// verdict. On success it returns the ruleset generation read right after
// the commit; on failure nothing of the batch was applied and the error is
// a *CommitError naming each failed message (or ErrGenerationChanged, or a
// socket error). An empty batch sends nothing and returns the current
// generation.
//
// If ctx ends after the batch was sent, Commit returns ctx's error and the
// batch may or may not have been applied.
func (c *Conn) Commit(ctx context.Context, b *Batch) (Generation, error) {
	if err := b.Err(); err != nil {
		return Generation{}, fmt.Errorf("nfnl: batch not sent: %w", err)
	}
	if b.Len() == 0 {
		return c.Generation(ctx)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Generation{}, ErrClosed
	}
	restore := func() {}
	if c.refuse != nil {
		// Put back as soon as sent: failures are described from the
		// batch's bytes.
		restore = b.misnameRules(c.refuse)
	}
	base := c.s.NextSeq(b.Len() + 3)
	p := b.frame(base)
	if tap := tapOf(ctx); tap != nil {
		if len(p) == 1 {
			tap(p[0])
		} else {
			tap(slices.Concat(p...))
		}
	}
	traceRequest(ctx, RequestCommit)
	err := c.s.Write(ctx, p...)
	b.unframe()
	restore()
	if err != nil {
		return Generation{}, err
	}
	probe := base + uint32(b.Len()) + 2
	if err := c.sendGetGen(ctx, probe); err != nil {
		return Generation{}, err
	}
	return c.collect(ctx, b, base, probe)
}

// frame writes BATCH_BEGIN into the reserved room and appends BATCH_END,
// numbering every message from base, and returns the bytes to send, in
// one buffer a chunk.
func (b *Batch) frame(base uint32) [][]byte {
	for i, off := range b.msgs {
		nl.PutSeq(b.at(int(off)), base+1+uint32(i))
	}
	start := nl.AttrHeaderLen + 4
	if b.check {
		start = 0
	}
	// BATCH_BEGIN, written in place: an nfgenmsg naming the subsystem,
	// and the generation the batch requires, if any.
	hdr := b.at(0)[start:batchReserve]
	h := nl.AppendHeader(hdr[:0], msgBatchBegin, nl.Request)
	h = binary.BigEndian.AppendUint16(append(h, 0, 0), subsysNFTables)
	if b.check {
		h = binary.BigEndian.AppendUint32(nl.AppendAttrHeader(h, attrBatchGen, 4), b.genID)
	}
	nl.PutLength(h)
	nl.PutSeq(h, base)
	m := b.enc.message(msgBatchEnd, nl.Request, 0, subsysNFTables)
	b.enc.endMessage(m)
	nl.PutSeq(b.enc.b[m:], base+uint32(len(b.msgs))+1)
	out := make([][]byte, 0, len(b.chunks)+1)
	for _, c := range append(b.chunks, b.enc.b) {
		if len(out) == 0 {
			c = c[start:]
		}
		out = append(out, c)
	}
	return out
}

// unframe removes the BATCH_END that frame appended.
func (b *Batch) unframe() {
	b.enc.b = b.enc.b[:len(b.enc.b)-nl.HeaderLen-nfgenLen]
}

// collect reads the kernel's answers up to the reply to the generation
// probe: errors for the batch's failed messages come before it.
func (c *Conn) collect(ctx context.Context, b *Batch, base, probe uint32) (Generation, error) {
	var failed []*MessageError
	b.echoed = nil
	for {
		msgs, err := c.s.Read(ctx)
		if err != nil {
			return Generation{}, err
		}
		for _, m := range msgs {
			if m.Type == nl.TypeError {
				errno, text, attr := errorOf(m)
				if m.Seq == probe && errno != 0 {
					return Generation{}, fmt.Errorf("nfnl: read generation: %w", errno)
				}
				if errno == 0 || m.Seq < base || m.Seq >= probe {
					continue
				}
				failed = append(failed, b.failure(int(m.Seq-base)-1, errno, text, attr))
				continue
			}
			if m.Type == subsysNFTables<<8|msgNewRule && m.Seq > base && m.Seq < probe {
				// A rule the batch asked to have echoed (Batch.Echo).
				r, err := parseRule(m.Data)
				if err != nil {
					return Generation{}, fmt.Errorf("nfnl: echoed rule: %w", err)
				}
				if b.echoed == nil {
					b.echoed = map[int]Rule{}
				}
				b.echoed[int(m.Seq-base)-1] = r
				continue
			}
			if m.Seq != probe || m.Type != subsysNFTables<<8|msgNewGen {
				continue
			}
			gen, err := parseGeneration(m.Data)
			if err != nil {
				return Generation{}, err
			}
			if len(failed) > 0 {
				return gen, b.commitError(failed)
			}
			return gen, nil
		}
	}
}

func (b *Batch) failure(i int, errno syscall.Errno, text string, attr int) *MessageError {
	e := &MessageError{Index: i, Errno: errno, Message: text}
	switch {
	case i < 0:
		e.Index, e.Op = -1, "commit"
	case i >= len(b.msgs):
		e.Index, e.Op = -1, "end of batch"
	default:
		e.Op = b.Describe(i)
		e.Owner = b.ownerOf(i, attr)
	}
	return e
}

func (b *Batch) commitError(failed []*MessageError) error {
	if b.check && len(failed) == 1 && failed[0].Index == -1 && failed[0].Errno == syscall.ERESTART {
		return fmt.Errorf("nfnl: commit: %w (expected generation %d)", ErrGenerationChanged, b.genID)
	}
	return &CommitError{Failed: failed}
}

func (c *Conn) sendGetGen(ctx context.Context, seq uint32) error {
	c.scratch.b = c.scratch.b[:0]
	m := c.scratch.message(subsysNFTables<<8|msgGetGen, nl.Request, 0, 0)
	c.scratch.endMessage(m)
	nl.PutSeq(c.scratch.b[m:], seq)
	return c.s.Write(ctx, c.scratch.b)
}

func parseGeneration(data []byte) (Generation, error) {
	if len(data) < nfgenLen {
		return Generation{}, fmt.Errorf("nfnl: short generation message")
	}
	as, err := attributes(data[nfgenLen:])
	if err != nil {
		return Generation{}, fmt.Errorf("nfnl: generation: %w", err)
	}
	var g Generation
	for _, a := range as {
		switch a.typ {
		case attrGenID:
			g.ID = a.u32()
		case attrGenPID:
			g.PID = a.u32()
		case attrGenProcess:
			g.Process = a.str()
		}
	}
	return g, nil
}

// Generation returns the current ruleset generation of the namespace. It
// costs one small round trip: compare it with the generation a Commit
// returned to learn whether anyone else committed since.
func (c *Conn) Generation(ctx context.Context) (Generation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Generation{}, ErrClosed
	}
	seq := c.s.NextSeq(1)
	traceRequest(ctx, RequestGeneration)
	if err := c.sendGetGen(ctx, seq); err != nil {
		return Generation{}, err
	}
	for {
		msgs, err := c.s.Read(ctx)
		if err != nil {
			return Generation{}, err
		}
		for _, m := range msgs {
			if m.Seq != seq {
				continue
			}
			if m.Type == nl.TypeError {
				if errno, _, _ := errorOf(m); errno != 0 {
					return Generation{}, fmt.Errorf("nfnl: read generation: %w", errno)
				}
				continue
			}
			return parseGeneration(m.Data)
		}
	}
}
