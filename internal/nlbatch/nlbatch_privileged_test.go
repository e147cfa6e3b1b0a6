//go:build privileged || vm

package nlbatch

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/netnstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// lo is the loopback's index in every namespace.
const lo = 1

func openIn(t *testing.T, h *netnstest.Host, o Options) *Conn {
	t.Helper()
	o.NetNS = int(h.NS)
	c, err := Open(unix.NETLINK_ROUTE, o)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func host(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}), 32)
}

// addresses returns the loopback's IPv4 addresses, sorted.
func addresses(t *testing.T, c *Conn) []netip.Prefix {
	t.Helper()
	list, err := c.Addresses(t.Context(), lo)
	require.NoError(t, err)
	var out []netip.Prefix
	for _, a := range list {
		if a.Prefix.Addr().Is4() && !a.Prefix.Addr().IsLoopback() {
			out = append(out, a.Prefix)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// TestSendOneDatagram: a batch goes in one sendmsg, the kernel handles
// every message of it, and Send reports each message's own outcome: a
// failed one in the middle stops nothing after it.
func TestSendOneDatagram(t *testing.T) {
	netnstest.Require(t, "netns")
	h := netnstest.NewHost(t, "nlbatch")
	c := openIn(t, h, Options{})
	var b Batch
	AddAddress(&b, lo, host(1), 0)
	AddAddress(&b, lo, host(1), 0) // there already
	AddAddress(&b, lo, host(2), 0)
	DelAddress(&b, lo, host(9)) // not there
	AddAddress(&b, lo, host(3), 0)
	errs, err := c.Send(t.Context(), &b)
	require.NoError(t, err)
	require.Len(t, errs, 5)
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], unix.EEXIST)
	assert.NoError(t, errs[2])
	assert.ErrorIs(t, errs[3], unix.EADDRNOTAVAIL)
	assert.NoError(t, errs[4])
	assert.Equal(t, 1, c.Stats().Datagrams, "one sendmsg for the batch")
	assert.Equal(t, []netip.Prefix{host(1), host(2), host(3)}, addresses(t, c))
}

// TestSendChunks: a batch longer than a chunk goes in several datagrams,
// and every failure is told against its own message, whichever chunk it
// was in, even when every message of a chunk fails.
func TestSendChunks(t *testing.T) {
	netnstest.Require(t, "netns")
	h := netnstest.NewHost(t, "nlbatch")
	c := openIn(t, h, Options{ChunkBytes: 1000})
	var b Batch
	for i := range 200 {
		AddAddress(&b, lo, host(i), 0)
	}
	per := len(b.message(0))
	errs, err := c.Send(t.Context(), &b)
	require.NoError(t, err)
	for i, e := range errs {
		require.NoError(t, e, "message %d", i)
	}
	chunks := (200 + 1000/per - 1) / (1000 / per)
	assert.Equal(t, chunks, c.Stats().Datagrams)
	assert.Len(t, addresses(t, c), 200)

	b.Reset()
	for i := range 200 {
		if i%3 == 0 {
			AddAddress(&b, lo, host(i), 0) // there already
		} else {
			DelAddress(&b, lo, host(i))
		}
	}
	errs, err = c.Send(t.Context(), &b)
	require.NoError(t, err)
	for i, e := range errs {
		if i%3 == 0 {
			assert.ErrorIs(t, e, unix.EEXIST, "message %d", i)
		} else {
			assert.NoError(t, e, "message %d", i)
		}
	}
	assert.Len(t, addresses(t, c), 67)
}

// TestSendManyFailures: a default chunk whose every message fails has
// room for all the answers in the receive buffer.
func TestSendManyFailures(t *testing.T) {
	netnstest.Require(t, "netns")
	h := netnstest.NewHost(t, "nlbatch")
	c := openIn(t, h, Options{})
	var b Batch
	for range 5000 {
		DelAddress(&b, lo, host(1))
	}
	errs, err := c.Send(t.Context(), &b)
	require.NoError(t, err)
	for i, e := range errs {
		require.ErrorIs(t, e, unix.EADDRNOTAVAIL, "message %d", i)
	}
}

// TestSendCanceled: a context that has ended sends nothing, and every
// message's outcome is unknown.
func TestSendCanceled(t *testing.T) {
	netnstest.Require(t, "netns")
	h := netnstest.NewHost(t, "nlbatch")
	c := openIn(t, h, Options{})
	var b Batch
	AddAddress(&b, lo, host(1), 0)
	AddAddress(&b, lo, host(2), 0)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	errs, err := c.Send(ctx, &b)
	require.ErrorIs(t, err, context.Canceled)
	for _, e := range errs {
		assert.ErrorIs(t, e, ErrUnknown)
	}
	assert.Zero(t, c.Stats().Datagrams)
	assert.Empty(t, addresses(t, c))
}

// TestGetAndDump: Get returns the kernel's reply or its refusal; a dump
// of many messages is read to its end.
func TestGetAndDump(t *testing.T) {
	netnstest.Require(t, "netns")
	h := netnstest.NewHost(t, "nlbatch")
	c := openIn(t, h, Options{})

	var b Batch
	b.Message(unix.RTM_GETLINK, 0, make([]byte, unix.SizeofIfInfomsg)...)
	b.String(unix.IFLA_IFNAME, "lo")
	var name string
	err := c.Get(t.Context(), &b, func(typ uint16, data []byte) error {
		require.Equal(t, uint16(unix.RTM_NEWLINK), typ)
		for at, v := range Attrs(data[unix.SizeofIfInfomsg:]) {
			if at == unix.IFLA_IFNAME {
				name = cstring(v)
			}
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, "lo", name)

	b.Reset()
	b.Message(unix.RTM_GETLINK, 0, make([]byte, unix.SizeofIfInfomsg)...)
	b.String(unix.IFLA_IFNAME, "kpt-none")
	err = c.Get(t.Context(), &b, func(uint16, []byte) error { return nil })
	assert.ErrorIs(t, err, unix.ENODEV)

	b.Reset()
	for i := range 3000 { // answers span many datagrams
		AddAddress(&b, lo, host(i), 0)
	}
	errs, err := c.Send(t.Context(), &b)
	require.NoError(t, err)
	require.NoError(t, firstErr(errs))
	assert.Len(t, addresses(t, c), 3000)

	stop := fmt.Errorf("stop")
	b.Reset()
	b.Message(unix.RTM_GETADDR, 0, ifaddrmsg(netip.Prefix{}, lo)...)
	n := 0
	err = c.Dump(t.Context(), &b, func(uint16, []byte) error {
		if n++; n == 10 {
			return stop
		}
		return nil
	})
	assert.ErrorIs(t, err, stop, "the function's error ends the dump")
	assert.Len(t, addresses(t, c), 3000, "and the connection reads on")
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
