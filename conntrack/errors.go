package conntrack

import (
	"errors"
	"fmt"

	"github.com/kproxy-dev/kproxy/servicelb"
)

var (
	// ErrInvalidStaleFlow: a stale-flow filter DeleteStale cannot apply
	// (unknown protocol, port 0, a destination and an endpoint of
	// different families, a zoned address).
	ErrInvalidStaleFlow = errors.New("invalid stale flow")
	// ErrInvalidFamily: a family other than servicelb.IPv4 and IPv6.
	ErrInvalidFamily = errors.New("invalid address family")
	// ErrDumpInterrupted: the kernel reported every attempt to dump the
	// table as interrupted by concurrent changes (NLM_F_DUMP_INTR).
	ErrDumpInterrupted = errors.New("conntrack dump interrupted")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("conntrack client closed")
)

// OpError is a failed operation on the conntrack table.
type OpError struct {
	// Op is "list" or "delete stale".
	Op     string
	Family servicelb.Family
	Err    error
}

func (e *OpError) Error() string { return fmt.Sprintf("conntrack %s %s: %v", e.Op, e.Family, e.Err) }

func (e *OpError) Unwrap() error { return e.Err }

// StaleFlowError names the invalid entry of a DeleteStale call.
type StaleFlowError struct {
	// Index is the entry's position in the slice given to DeleteStale.
	Index int
	Flow  servicelb.StaleFlow
	// Err wraps ErrInvalidStaleFlow.
	Err error
}

func (e *StaleFlowError) Error() string {
	return fmt.Sprintf("conntrack: stale flow %d (%s %s port %d): %v",
		e.Index, e.Flow.Protocol, e.Flow.Dst, e.Flow.Port, e.Err)
}

func (e *StaleFlowError) Unwrap() error { return e.Err }
