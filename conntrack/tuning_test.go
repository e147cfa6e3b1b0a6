package conntrack

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTuningValidate(t *testing.T) {
	require.NoError(t, Tuning{}.Validate())
	require.NoError(t, Tuning{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour}.Validate())
	for _, bad := range []Tuning{
		{MaxPerCore: -1},
		{Min: -1},
		{TCPCloseWaitTimeout: 1500 * time.Millisecond},
		{UDPTimeout: -time.Second},
	} {
		assert.ErrorIs(t, bad.Validate(), ErrInvalidTuning, "%+v", bad)
	}
}

// TestTuningSettings: kube-proxy's formula for the table's size, and the
// sysctls written for each field set, none for the fields left zero.
func TestTuningSettings(t *testing.T) {
	tu := Tuning{MaxPerCore: 32768, Min: 131072}
	assert.Equal(t, 131072, tu.Max(2))
	assert.Equal(t, 262144, tu.Max(8))
	assert.Zero(t, Tuning{Min: 131072}.Max(8), "Min alone sets nothing")
	assert.Empty(t, Tuning{}.settings())
	got := map[string]string{}
	for _, s := range (Tuning{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour,
		TCPBeLiberal: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute}).settings() {
		got[s.Name] = s.Value
	}
	assert.Equal(t, map[string]string{
		"net.netfilter.nf_conntrack_tcp_timeout_established": "86400",
		"net.netfilter.nf_conntrack_tcp_timeout_close_wait":  "3600",
		"net.netfilter.nf_conntrack_tcp_be_liberal":          "1",
		"net.netfilter.nf_conntrack_udp_timeout":             "30",
		"net.netfilter.nf_conntrack_udp_timeout_stream":      "120",
	}, got)
}
