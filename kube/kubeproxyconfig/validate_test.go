package kubeproxyconfig

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// A defaulted empty file is valid, in every mode and with every local
// traffic detection that needs no parameter.
func TestValidateDefaults(t *testing.T) {
	for _, m := range []string{"", "iptables", "ipvs", "nftables", "ebpf", "userspace"} {
		c := &Config{Mode: kpv1alpha1.ProxyMode(m)}
		Default(c)
		assert.NoError(t, Validate(c), "mode %q", m)
	}
}

// Every case kube-proxy v1.36's validation refuses on Linux is refused,
// naming the field; a case of another mode's section is not checked.
func TestValidateRefuses(t *testing.T) {
	neg := func(s string) *metav1.Duration { d, _ := time.ParseDuration(s); return &metav1.Duration{Duration: d} }
	for _, tc := range []struct {
		name  string
		edit  func(c *Config)
		field string // "" when valid
	}{
		{"iptables.masqueradeBit 32", func(c *Config) { c.IPTables.MasqueradeBit = ptr(int32(32)) }, "iptables.masqueradeBit"},
		{"iptables.masqueradeBit -1, nftables mode too", func(c *Config) { c.Mode, c.IPTables.MasqueradeBit = ModeNFTables, ptr(int32(-1)) }, "iptables.masqueradeBit"},
		{"iptables.masqueradeBit 0", func(c *Config) { c.IPTables.MasqueradeBit = ptr(int32(0)) }, ""},
		{"nftables.masqueradeBit 32 in nftables mode", func(c *Config) { c.Mode, c.NFTables.MasqueradeBit = ModeNFTables, ptr(int32(32)) }, "nftables.masqueradeBit"},
		{"nftables.masqueradeBit 32 in iptables mode", func(c *Config) { c.NFTables.MasqueradeBit = ptr(int32(32)) }, ""},
		{"conntrack.maxPerCore -1", func(c *Config) { c.Conntrack.MaxPerCore = ptr(int32(-1)) }, "conntrack.maxPerCore"},
		{"conntrack.min -1", func(c *Config) { c.Conntrack.Min = ptr(int32(-1)) }, "conntrack.min"},
		{"conntrack.tcpEstablishedTimeout -1s", func(c *Config) { c.Conntrack.TCPEstablishedTimeout = neg("-1s") }, "conntrack.tcpEstablishedTimeout"},
		{"conntrack.tcpCloseWaitTimeout -1s", func(c *Config) { c.Conntrack.TCPCloseWaitTimeout = neg("-1s") }, "conntrack.tcpCloseWaitTimeout"},
		{"conntrack.udpTimeout -1s", func(c *Config) { c.Conntrack.UDPTimeout = *neg("-1s") }, "conntrack.udpTimeout"},
		{"conntrack.udpStreamTimeout -1s", func(c *Config) { c.Conntrack.UDPStreamTimeout = *neg("-1s") }, "conntrack.udpStreamTimeout"},
		{"oomScoreAdj 1001", func(c *Config) { c.OOMScoreAdj = ptr(int32(1001)) }, "oomScoreAdj"},
		{"oomScoreAdj -1001", func(c *Config) { c.OOMScoreAdj = ptr(int32(-1001)) }, "oomScoreAdj"},
		{"mode kernelspace", func(c *Config) { c.Mode = "kernelspace" }, "mode"},
		{"clientConnection.burst -1", func(c *Config) { c.ClientConnection.Burst = -1 }, "clientConnection.burst"},
		{"configSyncPeriod -1s", func(c *Config) { c.ConfigSyncPeriod = *neg("-1s") }, "configSyncPeriod"},
		{"iptables.syncPeriod -1s", func(c *Config) { c.IPTables.SyncPeriod = *neg("-1s") }, "iptables.syncPeriod"},
		{"iptables.minSyncPeriod -1s", func(c *Config) { c.IPTables.MinSyncPeriod = *neg("-1s") }, "iptables.minSyncPeriod"},
		{"iptables.minSyncPeriod over syncPeriod", func(c *Config) { c.IPTables.MinSyncPeriod = *neg("1m") }, "iptables.syncPeriod"},
		{"nftables.syncPeriod -1s in nftables mode", func(c *Config) { c.Mode, c.NFTables.SyncPeriod = ModeNFTables, *neg("-1s") }, "nftables.syncPeriod"},
		{"nftables.syncPeriod -1s in iptables mode", func(c *Config) { c.NFTables.SyncPeriod = *neg("-1s") }, ""},
		{"ipvs.minSyncPeriod over syncPeriod in ipvs mode", func(c *Config) { c.Mode, c.IPVS.MinSyncPeriod = ModeIPVS, *neg("1m") }, "ipvs.syncPeriod"},
		{"ipvs.tcpTimeout -1s in ipvs mode", func(c *Config) { c.Mode, c.IPVS.TCPTimeout = ModeIPVS, *neg("-1s") }, "ipvs.tcpTimeout"},
		{"ipvs.tcpFinTimeout -1s in ipvs mode", func(c *Config) { c.Mode, c.IPVS.TCPFinTimeout = ModeIPVS, *neg("-1s") }, "ipvs.tcpFinTimeout"},
		{"ipvs.udpTimeout -1s in ipvs mode", func(c *Config) { c.Mode, c.IPVS.UDPTimeout = ModeIPVS, *neg("-1s") }, "ipvs.udpTimeout"},
		{"ipvs.udpTimeout -1s in iptables mode", func(c *Config) { c.IPVS.UDPTimeout = *neg("-1s") }, ""},
		{"ipvs.excludeCIDRs not a CIDR", func(c *Config) { c.Mode, c.IPVS.ExcludeCIDRs = ModeIPVS, []string{"10.0.0.1"} }, "ipvs.excludeCIDRs[0]"},
		{"bindAddress not an IP", func(c *Config) { c.BindAddress = "node-1" }, "bindAddress"},
		{"healthzBindAddress without an IP", func(c *Config) { c.HealthzBindAddress = "node-1:10256" }, "healthzBindAddress"},
		{"healthzBindAddress port 0", func(c *Config) { c.HealthzBindAddress = "0.0.0.0:0" }, "healthzBindAddress"},
		{"metricsBindAddress port 65536", func(c *Config) { c.MetricsBindAddress = "127.0.0.1:65536" }, "metricsBindAddress"},
		{"nodePortAddresses not a CIDR", func(c *Config) { c.NodePortAddresses = []string{"10.0.0.1"} }, "nodePortAddresses[0]"},
		{"nodePortAddresses primary beside a CIDR", func(c *Config) { c.NodePortAddresses = []string{"primary", "10.0.0.0/8"} }, "nodePortAddresses[0]"},
		{"nodePortAddresses primary", func(c *Config) { c.NodePortAddresses = []string{"primary"} }, ""},
		{"showHiddenMetricsForVersion 1.30", func(c *Config) { c.ShowHiddenMetricsForVersion = "1.30" }, "showHiddenMetricsForVersion"},
		{"showHiddenMetricsForVersion 1.35", func(c *Config) { c.ShowHiddenMetricsForVersion = "1.35" }, ""},
		{"detectLocalMode Guess", func(c *Config) { c.DetectLocalMode = "Guess" }, "detectLocalMode"},
		{"detectLocalMode BridgeInterface without a bridge", func(c *Config) { c.DetectLocalMode = LocalBridgeInterface }, "detectLocal.bridgeInterface"},
		{"detectLocalMode InterfaceNamePrefix without a prefix", func(c *Config) { c.DetectLocalMode = LocalInterfaceNamePrefix }, "detectLocal.interfaceNamePrefix"},
		{"clusterCIDR not a CIDR", func(c *Config) { c.ClusterCIDR = "10.244.0.0" }, "clusterCIDR[0]"},
		{"clusterCIDR two of one family", func(c *Config) { c.ClusterCIDR = "10.244.0.0/16,10.245.0.0/16" }, "clusterCIDR"},
		{"clusterCIDR three", func(c *Config) { c.ClusterCIDR = "10.244.0.0/16,fd00::/48,10.245.0.0/16" }, "clusterCIDR"},
		{"clusterCIDR dual stack", func(c *Config) { c.ClusterCIDR = "10.244.0.0/16,fd00::/48" }, ""},
		{"clusterCIDR empty under ClusterCIDR", func(c *Config) { c.ClusterCIDR = "" }, ""},
		{"logging.format xml", func(c *Config) { c.Logging.Format = "xml" }, "logging.format"},
		{"logging.flushFrequency -1s", func(c *Config) { c.Logging.FlushFrequency.Duration.Duration = -time.Second }, "logging.flushFrequency"},
		{"logging.vmodule in json", func(c *Config) {
			c.Logging.Format, c.Logging.VModule = "json", logsapi.VModuleConfiguration{{FilePattern: "proxier", Verbosity: 4}}
		}, "logging.vmodule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Config{}
			Default(c)
			tc.edit(c)
			err := Validate(c)
			if tc.field == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalid)
			var fe *FieldError
			require.True(t, errors.As(err, &fe), "a *FieldError: %v", err)
			assert.Equal(t, tc.field, fe.Field, "%v", err)
		})
	}
}
