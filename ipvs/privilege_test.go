//go:build linux

package ipvs

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/privilege"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestNewPrivileges: New wants CAP_NET_ADMIN, and CAP_SYS_ADMIN only for
// a namespace other than the calling thread's, which it must enter; it
// names what is missing. The test runs in a throwaway namespace, on a
// thread whose effective set lacks the capability (the thread New opens
// its sockets on). Where the kernel has no IPVS, New then fails for that
// reason instead.
func TestNewPrivileges(t *testing.T) {
	home := netnstest.NewHost(t, "ipvs-priv-home")
	other := netnstest.NewHost(t, "ipvs-priv-other")
	newIn := func(o Options, drop int) (err error) {
		t.Helper()
		require.NoError(t, home.Do(func() error {
			netnstest.WithoutCapabilities(t, func() {
				var p *Proxier
				if p, err = New(o); err == nil {
					assert.NoError(t, p.Close())
				}
			}, drop)
			return nil
		}))
		return err
	}
	ok := func(t *testing.T, err error) {
		t.Helper()
		assert.NotErrorIs(t, err, servicelb.ErrPermission)
		if err != nil {
			assert.ErrorIs(t, err, ErrIPVSUnavailable)
		}
	}

	t.Run("own namespace without CAP_NET_ADMIN", func(t *testing.T) {
		err := newIn(Options{NoConntrackCleanup: true}, privilege.NetAdmin)
		require.ErrorIs(t, err, servicelb.ErrPermission)
		assert.Contains(t, err.Error(), "ipvs: programming IPVS needs CAP_NET_ADMIN, which")
		assert.NotContains(t, err.Error(), "CAP_SYS_ADMIN")
	})
	t.Run("own namespace without CAP_SYS_ADMIN", func(t *testing.T) {
		ok(t, newIn(Options{}, privilege.SysAdmin))
	})
	t.Run("own namespace by handle without CAP_SYS_ADMIN", func(t *testing.T) {
		ok(t, newIn(Options{NetNS: home.NS}, privilege.SysAdmin))
	})
	t.Run("other namespace without CAP_SYS_ADMIN", func(t *testing.T) {
		err := newIn(Options{NetNS: other.NS}, privilege.SysAdmin)
		require.ErrorIs(t, err, servicelb.ErrPermission)
		assert.Contains(t, err.Error(), "ipvs: entering another network namespace needs CAP_SYS_ADMIN, which")
	})
}
