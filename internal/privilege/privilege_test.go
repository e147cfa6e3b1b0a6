//go:build linux

package privilege

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func TestCheck(t *testing.T) {
	assert.NoError(t, Check(nil))
	other := errors.New("other")
	assert.Equal(t, other, Check(other))
	for _, e := range []error{syscall.EPERM, syscall.EACCES} {
		err := Check(fmt.Errorf("read table: %w", e))
		assert.ErrorIs(t, err, servicelb.ErrPermission)
		assert.ErrorIs(t, err, e)
		assert.Equal(t, err, Check(err), "wrapped twice")
	}
}

// TestRequire drops CAP_NET_ADMIN from the effective set of the test's
// own thread (capabilities are per thread) and checks that Require names
// it.
func TestRequire(t *testing.T) {
	require.NoError(t, Require("x", NetAdmin, SysAdmin))
	var err error
	netnstest.WithoutCapabilities(t, func() { err = Require("the proxier", NetAdmin, SysAdmin) }, NetAdmin)
	require.ErrorIs(t, err, servicelb.ErrPermission)
	assert.Contains(t, err.Error(), "the proxier needs CAP_NET_ADMIN, which")
	assert.NotContains(t, err.Error(), "CAP_SYS_ADMIN")
}
