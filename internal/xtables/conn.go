package xtables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

// Conn carries nf_tables messages to the kernel of one network namespace.
type Conn interface {
	// GenID returns the current nf_tables generation.
	GenID(ctx context.Context) (uint32, error)
	// Batch sends body, a sequence of nf_tables messages, as one batch
	// (one transaction). When genID is not zero the kernel refuses the
	// batch unless the generation is still genID, and the error matches
	// ErrGenChanged. It returns the messages the kernel echoed back for
	// messages flagged NLM_F_ECHO, in order. A failed batch changes
	// nothing; its error is a *BatchError when a message was refused.
	Batch(ctx context.Context, body []byte, genID uint32) ([][]byte, error)
	// Dump sends one dump request and returns the messages of the reply.
	Dump(ctx context.Context, req []byte) ([][]byte, error)
}

// ErrGenChanged reports a batch refused because someone else changed the
// ruleset since the generation it was built for.
var ErrGenChanged = errors.New("nf_tables generation changed")

// BatchError is a message of a batch that the kernel refused.
type BatchError struct {
	// Seq is the sequence number of the refused message.
	Seq uint32
	// Op describes it, such as "add rule to ip nat KPROXY-SVC-X".
	Op  string
	Err syscall.Errno
}

func (e *BatchError) Error() string { return fmt.Sprintf("%s: %v", e.Op, e.Err) }
func (e *BatchError) Unwrap() error { return e.Err }

// describe names the message with sequence number seq in a batch body.
func describe(body []byte, seq uint32) string {
	for len(body) >= 20 {
		n := int(binary.LittleEndian.Uint32(body))
		if n < 20 || n > len(body) {
			break
		}
		if binary.LittleEndian.Uint32(body[8:]) == seq {
			return describeMsg(body[:n])
		}
		body = body[(n+3)&^3:]
	}
	return fmt.Sprintf("message %d", seq)
}

func describeMsg(msg []byte) string {
	typ, f, payload, err := nfPayload(msg)
	if err != nil {
		return "malformed message"
	}
	attrs, _ := parseAttrs(payload)
	var table, chain string
	for _, a := range attrs {
		switch {
		case a.typ == 1:
			table = attrString(a)
		case typ == msgNewChain || typ == msgDelChain:
			if a.typ == attrChainName {
				chain = attrString(a)
			}
		case a.typ == attrRuleChain:
			chain = attrString(a)
		}
	}
	op := map[uint16]string{msgNewTable: "create table", msgNewChain: "create chain", msgDelChain: "delete chain",
		msgNewRule: "add rule to", msgDelRule: "delete rule from"}[typ]
	if typ == msgDelRule && !hasAttr(attrs, attrRuleHandle) {
		op = "flush chain"
	}
	if op == "" {
		op = fmt.Sprintf("message type %d", typ)
	}
	return fmt.Sprintf("%s %s %s %s", op, f, table, chain)
}

func hasAttr(attrs []attribute, typ uint16) bool {
	for _, a := range attrs {
		if a.typ == typ {
			return true
		}
	}
	return false
}
