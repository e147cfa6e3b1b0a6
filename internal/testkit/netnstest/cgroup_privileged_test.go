//go:build privileged

package netnstest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/ebpf/ebpftest"
)

func newCgroup(t *testing.T) string {
	t.Helper()
	e, err := ebpftest.New("kproxy-test")
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.Close()) })
	return e.Cgroup
}

// TestCgroupAsksFromTheCgroup: an ask with InCgroup comes from a process
// in the cgroup (the echo server sees a connection whose peer is a socket
// of that process), gets the same answer as one from the test process,
// and the process ends with the test.
func TestCgroupAsksFromTheCgroup(t *testing.T) {
	tp := New(t, Options{Backends: 1})
	tp.Backends[0].Serve(t, "tcp", 8080)
	tp.Backends[0].Serve(t, "udp", 8080)
	var pid int
	t.Run("asks", func(t *testing.T) {
		dir := newCgroup(t)
		c := StartCgroup(t, dir)
		pid = c.cmd.Process.Pid
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		require.NoError(t, err)
		assert.Contains(t, string(b), "0::"+cgroupOf(dir)+"\n")
		procs, err := os.ReadFile(dir + "/cgroup.procs")
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprint(pid), strings.TrimSpace(string(procs)), "the asker is the cgroup's only process")
		dst := netip.AddrPortFrom(tp.Backends[0].IPv4, 8080)
		for _, ask := range []struct {
			proto string
			opts  []AskOption
		}{{"tcp", nil}, {"udp", nil}, {"udp", []AskOption{Unconnected()}}} {
			for _, opts := range [][]AskOption{ask.opts, append(ask.opts, InCgroup(c))} {
				var peer netip.AddrPort
				r, err := tp.Client.Ask(context.Background(), ask.proto, dst, append(opts, Peer(&peer))...)
				require.NoError(t, err, ask.proto)
				assert.Equal(t, "backend-0", r.Host)
				assert.Equal(t, tp.Client.IPv4, r.Client.Addr())
				assert.Equal(t, dst, peer, "%s: the peer the socket saw", ask.proto)
			}
		}
	})
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "the asker outlived its test")
}

// TestCgroupReportsFailuresAtTheSocket: a connect that fails at once
// (no route: nothing is sent) is AtSocket, with its errno, through the
// cgroup's process as from the test process; a reset is not.
func TestCgroupReportsFailuresAtTheSocket(t *testing.T) {
	tp := New(t, Options{Backends: 1})
	c := StartCgroup(t, newCgroup(t))
	lone := NewHost(t, "lone")
	for _, opts := range [][]AskOption{nil, {InCgroup(c)}} {
		for _, proto := range []string{"tcp", "udp"} {
			_, err := lone.Ask(context.Background(), proto, netip.MustParseAddrPort("192.0.2.1:80"), opts...)
			var ae *AskError
			require.ErrorAs(t, err, &ae, proto)
			assert.True(t, ae.AtSocket, "%s: %v", proto, err)
			assert.ErrorIs(t, err, syscall.ENETUNREACH, proto)
		}
		_, err := tp.Client.Ask(context.Background(), "tcp", netip.AddrPortFrom(tp.Backends[0].IPv4, 9), opts...)
		var ae *AskError
		require.ErrorAs(t, err, &ae)
		assert.False(t, ae.AtSocket, "a reset: %v", err)
		assert.True(t, errors.Is(err, ErrRefused), "%v", err)
	}
}
