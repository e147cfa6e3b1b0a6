//go:build privileged || vm

package nl_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// lo is the loopback's index in every namespace.
const lo = 1

func openIn(t *testing.T, h *netnstest.Host, o nl.Options) *nl.Conn {
	t.Helper()
	o.NetNS = int(h.NS)
	c, err := nl.Open(unix.NETLINK_ROUTE, o)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func host(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}), 32)
}

// The requests these tests batch add and delete IPv4 addresses on the
// loopback, whose outcome each is easy to provoke: an add of an address
// that is there fails with EEXIST, a delete of one that is not with
// EADDRNOTAVAIL. (Package internal/rtnl writes the backends' address
// requests; these are the smallest the kernel takes.)

// addAddress appends the request that adds p to the loopback.
func addAddress(b *nl.Batch, p netip.Prefix) {
	addrRequest(b, unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, p)
}

// delAddress appends the request that deletes p from the loopback.
func delAddress(b *nl.Batch, p netip.Prefix) { addrRequest(b, unix.RTM_DELADDR, 0, p) }

func addrRequest(b *nl.Batch, typ, flags uint16, p netip.Prefix) {
	b.Message(typ, flags, binary.NativeEndian.AppendUint32([]byte{unix.AF_INET, uint8(p.Bits()), 0, 0}, lo)...)
	b.Addr(unix.IFA_LOCAL, p.Addr())
}

// addresses returns the loopback's IPv4 addresses but 127.0.0.1, sorted,
// as ip(8) lists them.
func addresses(t *testing.T, h *netnstest.Host) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, line := range strings.Split(h.Exec(t, "ip", "-4", "-o", "address", "show", "dev", "lo"), "\n") {
		f := strings.Fields(line)
		i := slices.Index(f, "inet")
		if i < 0 || i+1 >= len(f) {
			continue
		}
		p := netip.MustParsePrefix(f[i+1])
		if !p.Addr().IsLoopback() {
			out = append(out, p)
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
	h := netnstest.NewHost(t, "nl")
	c := openIn(t, h, nl.Options{})
	var b nl.Batch
	addAddress(&b, host(1))
	addAddress(&b, host(1)) // there already
	addAddress(&b, host(2))
	delAddress(&b, host(9)) // not there
	addAddress(&b, host(3))
	errs, err := c.Send(t.Context(), &b)
	require.NoError(t, err)
	require.Len(t, errs, 5)
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], unix.EEXIST)
	assert.NoError(t, errs[2])
	assert.ErrorIs(t, errs[3], unix.EADDRNOTAVAIL)
	assert.NoError(t, errs[4])
	assert.Equal(t, 1, c.Stats().Datagrams, "one sendmsg for the batch")
	assert.Equal(t, []netip.Prefix{host(1), host(2), host(3)}, addresses(t, h))
}

// TestSendChunks: a batch longer than a chunk goes in several datagrams,
// and every failure is told against its own message, whichever chunk it
// was in, even when every message of a chunk fails.
func TestSendChunks(t *testing.T) {
	netnstest.Require(t, "netns")
	h := netnstest.NewHost(t, "nl")
	c := openIn(t, h, nl.Options{ChunkBytes: 1000})
	var b nl.Batch
	for i := range 200 {
		addAddress(&b, host(i))
	}
	per := b.Size() / b.Len() // every message is as long
	errs, err := c.Send(t.Context(), &b)
	require.NoError(t, err)
	for i, e := range errs {
		require.NoError(t, e, "message %d", i)
	}
	chunks := (200 + 1000/per - 1) / (1000 / per)
	assert.Equal(t, chunks, c.Stats().Datagrams)
	assert.Len(t, addresses(t, h), 200)

	b.Reset()
	for i := range 200 {
		if i%3 == 0 {
			addAddress(&b, host(i)) // there already
		} else {
			delAddress(&b, host(i))
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
	assert.Len(t, addresses(t, h), 67)
}

// TestSendManyFailures: a default chunk whose every message fails has
// room for all the answers in the receive buffer.
func TestSendManyFailures(t *testing.T) {
	netnstest.Require(t, "netns")
	h := netnstest.NewHost(t, "nl")
	c := openIn(t, h, nl.Options{})
	var b nl.Batch
	for range 5000 {
		delAddress(&b, host(1))
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
	h := netnstest.NewHost(t, "nl")
	c := openIn(t, h, nl.Options{})
	var b nl.Batch
	addAddress(&b, host(1))
	addAddress(&b, host(2))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	errs, err := c.Send(ctx, &b)
	require.ErrorIs(t, err, context.Canceled)
	for _, e := range errs {
		assert.ErrorIs(t, e, nl.ErrUnknown)
	}
	assert.Zero(t, c.Stats().Datagrams)
	assert.Empty(t, addresses(t, h))
}

// TestGetAndDump: Get returns the kernel's reply or its refusal; a dump
// of many messages is read to its end.
func TestGetAndDump(t *testing.T) {
	netnstest.Require(t, "netns")
	h := netnstest.NewHost(t, "nl")
	c := openIn(t, h, nl.Options{})

	var b nl.Batch
	b.Message(unix.RTM_GETLINK, 0, make([]byte, unix.SizeofIfInfomsg)...)
	b.String(unix.IFLA_IFNAME, "lo")
	var name string
	err := c.Get(t.Context(), &b, func(typ uint16, data []byte) error {
		require.Equal(t, uint16(unix.RTM_NEWLINK), typ)
		for at, v := range nl.Attrs(data[unix.SizeofIfInfomsg:]) {
			if at == unix.IFLA_IFNAME {
				name = strings.TrimRight(string(v), "\x00")
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
		addAddress(&b, host(i))
	}
	errs, err := c.Send(t.Context(), &b)
	require.NoError(t, err)
	require.NoError(t, firstErr(errs))
	assert.Len(t, addresses(t, h), 3000)

	stop := fmt.Errorf("stop")
	b.Reset()
	b.Message(unix.RTM_GETADDR, 0, unix.AF_INET, 0, 0, 0, 0, 0, 0, 0) // every link's IPv4 addresses
	dump := func(stopAt int) (int, error) {
		n := 0
		err := c.Dump(t.Context(), &b, func(typ uint16, _ []byte) error {
			if typ == unix.RTM_NEWADDR {
				n++
			}
			if n == stopAt {
				return stop
			}
			return nil
		})
		return n, err
	}
	n, err := dump(-1)
	require.NoError(t, err)
	assert.Equal(t, 3001, n, "the loopback's addresses, 127.0.0.1 included")
	_, err = dump(10)
	assert.ErrorIs(t, err, stop, "the function's error ends the dump")
	n, err = dump(-1)
	require.NoError(t, err)
	assert.Equal(t, 3001, n, "and the connection reads on")
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
