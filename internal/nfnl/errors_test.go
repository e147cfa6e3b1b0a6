//go:build linux

package nfnl

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
)

// LostRace tells the errors of a race lost with another writer, however
// wrapped, from every other refusal.
func TestLostRace(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{ErrDumpInterrupted, true},
		{fmt.Errorf("check table: %w", ErrDumpInterrupted), true},
		{fmt.Errorf("nfnl: commit: %w (expected generation 7)", ErrGenerationChanged), true},
		{errors.Join(errors.New("commit"), ErrGenerationChanged), true},
		{&CommitError{Failed: []*MessageError{{Index: 3, Op: "add rule inet kproxy services", Errno: syscall.ENOENT}}}, false},
		{ErrNotExist, false},
		{syscall.EBUSY, false},
		{nil, false},
	} {
		assert.Equal(t, tc.want, LostRace(tc.err), "%v", tc.err)
	}
}
