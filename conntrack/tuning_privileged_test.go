//go:build privileged || vm

package conntrack_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestTuningApply applies kube-proxy's settings in a throwaway namespace:
// the timeouts and tcp_be_liberal are the namespace's and change there;
// the table's size is the kernel's, refused with ErrNotNamespaced before
// anything global changes (the hash size stays), while the rest applies.
func TestTuningApply(t *testing.T) {
	netnstest.Require(t, "conntrack")
	h := netnstest.NewHost(t, "tuning")
	hash, err := os.ReadFile("/sys/module/nf_conntrack/parameters/hashsize")
	require.NoError(t, err)
	tu := conntrack.Tuning{MaxPerCore: 1 << 20, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour,
		TCPBeLiberal: true, UDPTimeout: 31 * time.Second}
	changed, err := tu.Apply(h.NS)
	require.ErrorIs(t, err, conntrack.ErrNotNamespaced)
	assert.Contains(t, err.Error(), "nf_conntrack_max")
	names := map[string]string{}
	for _, c := range changed {
		names[c.Name] = c.Value
	}
	assert.Equal(t, map[string]string{
		"net.netfilter.nf_conntrack_tcp_timeout_established": "86400",
		"net.netfilter.nf_conntrack_tcp_timeout_close_wait":  "3600",
		"net.netfilter.nf_conntrack_tcp_be_liberal":          "1",
		"net.netfilter.nf_conntrack_udp_timeout":             "31",
	}, names)
	for name, want := range names {
		assert.Equal(t, want+"\n", h.Exec(t, "cat", "/proc/sys/"+strings.ReplaceAll(name, ".", "/")), name)
	}
	after, err := os.ReadFile("/sys/module/nf_conntrack/parameters/hashsize")
	require.NoError(t, err)
	assert.Equal(t, string(hash), string(after), "the global hash size changed")

	changed, err = conntrack.Tuning{TCPBeLiberal: true, UDPTimeout: 31 * time.Second}.Apply(h.NS)
	require.NoError(t, err)
	assert.Empty(t, changed, "a second Apply changes nothing")
}
