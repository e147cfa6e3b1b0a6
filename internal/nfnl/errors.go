//go:build linux

package nfnl

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

var (
	// ErrNotExist: the table, chain or set asked for does not exist.
	ErrNotExist = errors.New("does not exist")
	// ErrGenerationChanged: a batch made with RequireGeneration found that
	// someone else committed since; nothing was applied.
	ErrGenerationChanged = errors.New("ruleset generation changed")
	// ErrDumpInterrupted: the ruleset changed while the kernel dumped it;
	// the dump is inconsistent and should be retried. It is internal/nl's,
	// for every family.
	ErrDumpInterrupted = nl.ErrDumpInterrupted
	// ErrClosed: the Conn is closed.
	ErrClosed = errors.New("connection closed")
)

// RefusedOwners returns, when err holds a *CommitError each of whose
// failed messages has an owner of type O (Batch.SetOwner), every such
// owner with the failures of its messages (a *CommitError listing
// them); else nil: a refusal that is not all about owners of that type,
// such as one of a message shared by several owners or of the commit as
// a whole.
func RefusedOwners[O comparable](err error) map[O]error {
	var ce *CommitError
	if !errors.As(err, &ce) || len(ce.Failed) == 0 {
		return nil
	}
	byOwner := map[O]*CommitError{}
	for _, f := range ce.Failed {
		o, ok := f.Owner.(O)
		if !ok {
			return nil
		}
		if byOwner[o] == nil {
			byOwner[o] = &CommitError{}
		}
		byOwner[o].Failed = append(byOwner[o].Failed, f)
	}
	out := make(map[O]error, len(byOwner))
	for o, c := range byOwner {
		out[o] = c
	}
	return out
}

// LostRace reports whether err is a race lost with another writer of the
// ruleset: a dump a commit interrupted (ErrDumpInterrupted), or a batch
// refused because the generation moved since it was read
// (ErrGenerationChanged). Nothing was applied, and the same step tried
// again a moment later usually succeeds: the backends' sync engine
// retries such a step within the same sync.
func LostRace(err error) bool {
	return errors.Is(err, ErrDumpInterrupted) || errors.Is(err, ErrGenerationChanged)
}

// MessageError is the kernel's answer to one failed message of a batch.
type MessageError struct {
	// Index is the message's position in the batch (0-based); -1 for the
	// batch as a whole (a failure at commit time).
	Index int
	// Op describes the message, such as "add rule inet kproxy services".
	Op string
	// Errno is the kernel's error number.
	Errno syscall.Errno
	// Message is the kernel's extended acknowledgement text, if any.
	Message string
	// Owner is whose the message is (Batch.SetOwner): for a message of
	// elements, the owner of the element the kernel points at, or when it
	// points at none, of all its elements. nil when it has none, or
	// several.
	Owner any
}

func (e *MessageError) Error() string {
	s := fmt.Sprintf("%s: %v", e.Op, e.Errno)
	if e.Message != "" {
		s += " (" + e.Message + ")"
	}
	return s
}

func (e *MessageError) Unwrap() error { return e.Errno }

// CommitError reports a batch the kernel refused. Nothing of the batch was
// applied. errors.Is finds each message's errno (e.g. syscall.ENOENT) and
// errors.As each *MessageError.
type CommitError struct {
	// Failed lists the failed messages in batch order.
	Failed []*MessageError
}

func (e *CommitError) Error() string {
	if len(e.Failed) == 0 {
		return "nfnl: commit failed"
	}
	var b strings.Builder
	b.WriteString("nfnl: commit: ")
	b.WriteString(e.Failed[0].Error())
	if n := len(e.Failed) - 1; n > 0 {
		fmt.Fprintf(&b, " (and %d more failed message", n)
		if n > 1 {
			b.WriteByte('s')
		}
		b.WriteByte(')')
	}
	return b.String()
}

func (e *CommitError) Unwrap() []error {
	out := make([]error, 0, len(e.Failed))
	for _, f := range e.Failed {
		out = append(out, f)
	}
	return out
}
