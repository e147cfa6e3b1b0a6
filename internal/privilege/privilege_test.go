//go:build linux

package privilege

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/netnstest"
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
// it, then raises it again from the permitted set.
func TestRequire(t *testing.T) {
	netnstest.Require(t, "root") // the capabilities to drop
	runtime.LockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	require.NoError(t, unix.Capget(&hdr, &data[0]))
	saved := data
	require.NoError(t, Require("x", NetAdmin, SysAdmin))
	data[0].Effective &^= 1 << NetAdmin
	require.NoError(t, unix.Capset(&hdr, &data[0]))
	err := Require("the proxier", NetAdmin, SysAdmin)
	restored := unix.Capset(&hdr, &saved[0])
	if restored == nil {
		runtime.UnlockOSThread() // else the thread ends with the test
	}
	require.NoError(t, restored)
	require.ErrorIs(t, err, servicelb.ErrPermission)
	assert.Contains(t, err.Error(), "the proxier needs CAP_NET_ADMIN, which")
}
