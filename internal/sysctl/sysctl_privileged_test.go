//go:build privileged || vm

package sysctl_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/sysctl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestApply writes a setting the kernel scopes to the namespace, in a
// throwaway namespace: Differing then Apply report it once, Get reads it
// back, and a second Apply changes nothing. A setting the kernel keeps for
// the initial namespace fails with ErrNotSettable, and the others of the
// call are applied all the same.
func TestApply(t *testing.T) {
	netnstest.Require(t, "conntrack")
	h := netnstest.NewHost(t, "sysctl")
	liberal := sysctl.Setting{Name: "net.netfilter.nf_conntrack_tcp_be_liberal", Value: "1"}
	localnet := sysctl.Setting{Name: "net.ipv4.conf.all.route_localnet", Value: "1"}
	want := []sysctl.Setting{liberal, localnet}

	differ, err := sysctl.Differing(h.NS, want)
	require.NoError(t, err)
	require.Equal(t, []sysctl.Change{{Setting: liberal, Old: "0"}, {Setting: localnet, Old: "0"}}, differ)
	changed, err := sysctl.Apply(h.NS, want)
	require.NoError(t, err)
	assert.Equal(t, differ, changed)
	v, err := sysctl.Get(h.NS, localnet.Name)
	require.NoError(t, err)
	assert.Equal(t, "1", v)
	assert.Equal(t, "1\n", h.Exec(t, "cat", "/proc/sys/net/ipv4/conf/all/route_localnet"))
	changed, err = sysctl.Apply(h.NS, want)
	require.NoError(t, err)
	assert.Empty(t, changed)

	max := sysctl.Setting{Name: "net.netfilter.nf_conntrack_max", Value: "12345"}
	timeout := sysctl.Setting{Name: "net.netfilter.nf_conntrack_tcp_timeout_close_wait", Value: "3599"}
	changed, err = sysctl.Apply(h.NS, []sysctl.Setting{max, timeout})
	require.ErrorIs(t, err, sysctl.ErrNotSettable)
	var se *sysctl.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, max, se.Setting)
	assert.Equal(t, []sysctl.Change{{Setting: timeout, Old: "60"}}, changed, "the kernel's default close-wait timeout is 60 s")

	_, err = sysctl.Get(h.NS, "net.ipv4.no_such_setting")
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "read", se.Op)
}
