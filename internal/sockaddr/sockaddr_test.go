//go:build linux

package sockaddr

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"
)

func TestRoundTrip(t *testing.T) {
	for _, s := range []string{"10.0.0.1:80", "[fd00::1]:443", "0.0.0.0:0"} {
		ap := netip.MustParseAddrPort(s)
		assert.Equal(t, ap, To(From(ap)), s)
	}
	mapped := &unix.SockaddrInet6{Port: 53, Addr: netip.MustParseAddr("::ffff:192.0.2.1").As16()}
	assert.Equal(t, netip.MustParseAddrPort("192.0.2.1:53"), To(mapped), "a mapped address is unmapped")
	assert.False(t, To(&unix.SockaddrUnix{Name: "x"}).IsValid())
}
