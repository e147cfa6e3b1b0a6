package kubeproxyconfig

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Every field kube-proxy v1.36 defaults on Linux, with the value an empty
// file gets, the value a field set in the file keeps, and, for a pointer
// field, an explicit zero that stays zero.
func TestDefault(t *testing.T) {
	d := func(s string) metav1.Duration {
		v, err := time.ParseDuration(s)
		if err != nil {
			panic(err)
		}
		return metav1.Duration{Duration: v}
	}
	for _, tc := range []struct {
		field string
		// get reads the field as text.
		get func(c *Config) any
		// empty is the default an empty file gets.
		empty any
		// set sets the field to a value of the file, kept as want.
		set  func(c *Config)
		want any
	}{
		{"bindAddress", func(c *Config) any { return c.BindAddress }, "0.0.0.0",
			func(c *Config) { c.BindAddress = "10.0.0.1" }, "10.0.0.1"},
		{"healthzBindAddress", func(c *Config) any { return c.HealthzBindAddress }, "0.0.0.0:10256",
			func(c *Config) { c.HealthzBindAddress = "10.0.0.1" }, "10.0.0.1:10256"},
		{"healthzBindAddress of an IPv6 bindAddress", func(c *Config) any { return c.HealthzBindAddress }, "0.0.0.0:10256",
			func(c *Config) { c.BindAddress = "::" }, "[::]:10256"},
		{"metricsBindAddress", func(c *Config) any { return c.MetricsBindAddress }, "127.0.0.1:10249",
			func(c *Config) { c.MetricsBindAddress = "0.0.0.0" }, "0.0.0.0:10249"},
		{"metricsBindAddress of an IPv6 bindAddress", func(c *Config) any { return c.MetricsBindAddress }, "127.0.0.1:10249",
			func(c *Config) { c.BindAddress = "fd00::1" }, "[::1]:10249"},
		{"metricsBindAddress with a port", func(c *Config) any { return c.MetricsBindAddress }, "127.0.0.1:10249",
			func(c *Config) { c.MetricsBindAddress = "10.0.0.1:9999" }, "10.0.0.1:9999"},
		{"oomScoreAdj", func(c *Config) any { return *c.OOMScoreAdj }, int32(-999),
			func(c *Config) { c.OOMScoreAdj = ptr(int32(0)) }, int32(0)},
		{"iptables.syncPeriod", func(c *Config) any { return c.IPTables.SyncPeriod }, d("30s"),
			func(c *Config) { c.IPTables.SyncPeriod = d("1m") }, d("1m")},
		{"iptables.minSyncPeriod", func(c *Config) any { return c.IPTables.MinSyncPeriod }, d("1s"),
			func(c *Config) { c.IPTables.MinSyncPeriod = d("0s") }, d("1s")},
		{"iptables.localhostNodePorts", func(c *Config) any { return *c.IPTables.LocalhostNodePorts }, true,
			func(c *Config) { c.IPTables.LocalhostNodePorts = ptr(false) }, false},
		{"iptables.masqueradeBit", func(c *Config) any { return *c.IPTables.MasqueradeBit }, int32(14),
			func(c *Config) { c.IPTables.MasqueradeBit = ptr(int32(0)) }, int32(0)},
		{"ipvs.syncPeriod", func(c *Config) any { return c.IPVS.SyncPeriod }, d("30s"),
			func(c *Config) { c.IPVS.SyncPeriod = d("5s") }, d("5s")},
		{"ipvs.minSyncPeriod, which has no default", func(c *Config) any { return c.IPVS.MinSyncPeriod }, d("0s"),
			func(c *Config) { c.IPVS.MinSyncPeriod = d("2s") }, d("2s")},
		{"nftables.syncPeriod", func(c *Config) any { return c.NFTables.SyncPeriod }, d("30s"),
			func(c *Config) { c.NFTables.SyncPeriod = d("5s") }, d("5s")},
		{"nftables.minSyncPeriod", func(c *Config) any { return c.NFTables.MinSyncPeriod }, d("1s"),
			func(c *Config) { c.NFTables.MinSyncPeriod = d("2s") }, d("2s")},
		{"nftables.masqueradeBit", func(c *Config) any { return *c.NFTables.MasqueradeBit }, int32(14),
			func(c *Config) { c.NFTables.MasqueradeBit = ptr(int32(3)) }, int32(3)},
		{"conntrack.maxPerCore", func(c *Config) any { return *c.Conntrack.MaxPerCore }, int32(32768),
			func(c *Config) { c.Conntrack.MaxPerCore = ptr(int32(0)) }, int32(0)},
		{"conntrack.min", func(c *Config) any { return *c.Conntrack.Min }, int32(131072),
			func(c *Config) { c.Conntrack.Min = ptr(int32(0)) }, int32(0)},
		{"conntrack.tcpEstablishedTimeout", func(c *Config) any { return *c.Conntrack.TCPEstablishedTimeout }, d("24h"),
			func(c *Config) { c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{} }, d("0s")},
		{"conntrack.tcpCloseWaitTimeout", func(c *Config) any { return *c.Conntrack.TCPCloseWaitTimeout }, d("1h"),
			func(c *Config) { c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{} }, d("0s")},
		{"conntrack.udpTimeout, which has no default", func(c *Config) any { return c.Conntrack.UDPTimeout }, d("0s"),
			func(c *Config) { c.Conntrack.UDPTimeout = d("30s") }, d("30s")},
		{"configSyncPeriod", func(c *Config) any { return c.ConfigSyncPeriod }, d("15m"),
			func(c *Config) { c.ConfigSyncPeriod = d("1m") }, d("1m")},
		{"clientConnection.contentType", func(c *Config) any { return c.ClientConnection.ContentType }, "application/vnd.kubernetes.protobuf",
			func(c *Config) { c.ClientConnection.ContentType = "application/json" }, "application/json"},
		{"clientConnection.qps", func(c *Config) any { return c.ClientConnection.QPS }, float32(5),
			func(c *Config) { c.ClientConnection.QPS = 50 }, float32(50)},
		{"clientConnection.burst", func(c *Config) any { return c.ClientConnection.Burst }, int32(10),
			func(c *Config) { c.ClientConnection.Burst = 100 }, int32(100)},
		{"featureGates", func(c *Config) any { return c.FeatureGates }, map[string]bool{},
			func(c *Config) { c.FeatureGates = map[string]bool{"A": true} }, map[string]bool{"A": true}},
		{"logging.format", func(c *Config) any { return c.Logging.Format }, "text",
			func(c *Config) { c.Logging.Format = "json" }, "json"},
		{"logging.flushFrequency", func(c *Config) any { return c.Logging.FlushFrequency.Duration.Duration }, 5 * time.Second,
			func(c *Config) { c.Logging.FlushFrequency.Duration.Duration = time.Second }, time.Second},
		{"mode", func(c *Config) any { return c.Mode }, ModeIPTables,
			func(c *Config) { c.Mode = ModeNFTables }, ModeNFTables},
		{"nodePortAddresses of the iptables mode", func(c *Config) any { return c.NodePortAddresses }, []string(nil),
			func(c *Config) { c.NodePortAddresses = []string{"10.0.0.0/8"} }, []string{"10.0.0.0/8"}},
		{"nodePortAddresses of the nftables mode", func(c *Config) any { return c.NodePortAddresses }, []string(nil),
			func(c *Config) { c.Mode = ModeNFTables }, []string{"primary"}},
		{"nodePortAddresses of the nftables mode, set", func(c *Config) any { return c.NodePortAddresses }, []string(nil),
			func(c *Config) { c.Mode, c.NodePortAddresses = ModeNFTables, []string{"10.0.0.0/8"} }, []string{"10.0.0.0/8"}},
		{"detectLocalMode", func(c *Config) any { return c.DetectLocalMode }, LocalClusterCIDR,
			func(c *Config) { c.DetectLocalMode = LocalNodeCIDR }, LocalNodeCIDR},
	} {
		t.Run(tc.field, func(t *testing.T) {
			var empty Config
			Default(&empty)
			assert.Equal(t, tc.empty, tc.get(&empty), "an empty file")
			var set Config
			tc.set(&set)
			Default(&set)
			assert.Equal(t, tc.want, tc.get(&set), "set in the file")
		})
	}
}
