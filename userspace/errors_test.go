//go:build linux

package userspace

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/privilege"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestBindPermission: a low port refused for lack of privilege names
// CAP_NET_BIND_SERVICE, matches servicelb.ErrPermission, and keeps its
// message through the sync engine's privilege check; other bind errors
// are not permission errors.
func TestBindPermission(t *testing.T) {
	at := netip.MustParseAddrPort("10.96.0.10:80")
	err := privilege.Check(bindError(at, unix.EACCES))
	assert.ErrorIs(t, err, servicelb.ErrPermission)
	assert.ErrorIs(t, err, unix.EACCES)
	assert.Contains(t, err.Error(), "CAP_NET_BIND_SERVICE")
	assert.NotContains(t, err.Error(), "CAP_NET_ADMIN")

	err = bindError(at, unix.EADDRINUSE)
	assert.NotErrorIs(t, err, servicelb.ErrPermission)
	assert.ErrorIs(t, err, unix.EADDRINUSE)
}
