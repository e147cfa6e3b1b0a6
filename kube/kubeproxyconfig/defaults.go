package kubeproxyconfig

import (
	"net"
	"net/netip"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// kube-proxy's default values (Kubernetes v1.36).
const (
	// HealthzPort and MetricsPort are the ports of the proxy's health and
	// metrics servers.
	HealthzPort = 10256
	MetricsPort = 10249
	// DefaultSyncPeriod and DefaultMinSyncPeriod bound the time between
	// two syncs.
	DefaultSyncPeriod    = 30 * time.Second
	DefaultMinSyncPeriod = time.Second
	// DefaultMasqueradeBit is the packet mark bit of traffic to
	// masquerade.
	DefaultMasqueradeBit = 14
	// DefaultConntrackMaxPerCore and DefaultConntrackMin size the
	// conntrack table (nf_conntrack_max).
	DefaultConntrackMaxPerCore = 32 * 1024
	DefaultConntrackMin        = 128 * 1024
	// DefaultOOMScoreAdj is the proxy's OOM score adjustment.
	DefaultOOMScoreAdj = -999
)

// Default fills in the fields of c that kube-proxy v1.36 defaults on
// Linux, the way it does: first as its scheme defaults a file or its
// flags (a pointer field that is nil, or another field that holds its
// zero value, gets the default: an explicit 0 of a pointer field stays,
// an explicit 0 of another does not), then as its Linux platform
// defaults the result (mode iptables; node ports on the primary
// addresses in nftables mode; local traffic by the cluster CIDR).
func Default(c *Config) {
	if c.BindAddress == "" {
		c.BindAddress = "0.0.0.0"
	}
	// The servers' default addresses follow bindAddress's family; an
	// address given without a port gets the default port.
	healthz, metrics := "0.0.0.0", "127.0.0.1"
	if !isIPv4(c.BindAddress) {
		healthz, metrics = "::", "::1"
	}
	c.HealthzBindAddress = addrWithPort(c.HealthzBindAddress, healthz, HealthzPort)
	c.MetricsBindAddress = addrWithPort(c.MetricsBindAddress, metrics, MetricsPort)
	if c.OOMScoreAdj == nil {
		c.OOMScoreAdj = ptr(int32(DefaultOOMScoreAdj))
	}
	defaultDuration(&c.IPTables.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&c.IPTables.MinSyncPeriod, DefaultMinSyncPeriod)
	if c.IPTables.LocalhostNodePorts == nil {
		c.IPTables.LocalhostNodePorts = ptr(true)
	}
	defaultDuration(&c.IPVS.SyncPeriod, DefaultSyncPeriod)
	// ipvs.minSyncPeriod has no default: 0 unless set.
	defaultDuration(&c.NFTables.SyncPeriod, DefaultSyncPeriod)
	defaultDuration(&c.NFTables.MinSyncPeriod, DefaultMinSyncPeriod)
	if c.IPTables.MasqueradeBit == nil {
		c.IPTables.MasqueradeBit = ptr(int32(DefaultMasqueradeBit))
	}
	if c.NFTables.MasqueradeBit == nil {
		c.NFTables.MasqueradeBit = ptr(int32(DefaultMasqueradeBit))
	}
	ct := &c.Conntrack
	if ct.MaxPerCore == nil {
		ct.MaxPerCore = ptr(int32(DefaultConntrackMaxPerCore))
	}
	if ct.Min == nil {
		ct.Min = ptr(int32(DefaultConntrackMin))
	}
	if ct.TCPEstablishedTimeout == nil {
		ct.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	}
	if ct.TCPCloseWaitTimeout == nil {
		ct.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	}
	defaultDuration(&c.ConfigSyncPeriod, 15*time.Minute)
	cc := &c.ClientConnection
	if cc.ContentType == "" {
		cc.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if cc.QPS == 0 {
		cc.QPS = 5
	}
	if cc.Burst == 0 {
		cc.Burst = 10
	}
	if c.FeatureGates == nil {
		c.FeatureGates = map[string]bool{}
	}
	l := &c.Logging
	if l.Format == "" {
		l.Format = "text"
	}
	defaultDuration(&l.FlushFrequency.Duration, 5*time.Second)
	platformDefaults(c)
}

// platformDefaults are kube-proxy's Linux defaults, applied after the
// file or the flags are read.
func platformDefaults(c *Config) {
	if c.Mode == "" {
		c.Mode = ModeIPTables
	}
	if nftablesMode(c.Mode) && len(c.NodePortAddresses) == 0 {
		c.NodePortAddresses = []string{PrimaryNodePortAddresses}
	}
	if c.DetectLocalMode == "" {
		c.DetectLocalMode = LocalClusterCIDR
	}
}

// nftablesMode reports whether a mode is nftables, or kproxy's ebpf, whose
// packet path is the nftables backend.
func nftablesMode(m kpv1alpha1.ProxyMode) bool {
	return m == ModeNFTables || m == ModeEBPF
}

// The modes: kube-proxy's, and kproxy's backends that are no mode of
// kube-proxy, which kproxy takes in mode too.
const (
	ModeIPTables  kpv1alpha1.ProxyMode = "iptables"
	ModeIPVS      kpv1alpha1.ProxyMode = "ipvs"
	ModeNFTables  kpv1alpha1.ProxyMode = "nftables"
	ModeEBPF      kpv1alpha1.ProxyMode = "ebpf"
	ModeUserspace kpv1alpha1.ProxyMode = "userspace"
)

// The local traffic detection modes.
const (
	LocalClusterCIDR         kpv1alpha1.LocalMode = "ClusterCIDR"
	LocalNodeCIDR            kpv1alpha1.LocalMode = "NodeCIDR"
	LocalBridgeInterface     kpv1alpha1.LocalMode = "BridgeInterface"
	LocalInterfaceNamePrefix kpv1alpha1.LocalMode = "InterfaceNamePrefix"
)

// PrimaryNodePortAddresses is the nodePortAddresses keyword that serves
// node ports on the node's primary addresses alone.
const PrimaryNodePortAddresses = "primary"

func defaultDuration(d *metav1.Duration, v time.Duration) {
	if d.Duration == 0 {
		d.Duration = v
	}
}

// isIPv4 reports whether an address parses as IPv4, as kube-proxy reads
// bindAddress (an address that does not parse counts as not IPv4).
func isIPv4(s string) bool {
	ip := net.ParseIP(s)
	return ip != nil && ip.To4() != nil
}

// addrWithPort returns addr with the default port when it is an address
// alone, def with it when addr is empty, and addr as it is otherwise (a
// host:port, or what validation refuses).
func addrWithPort(addr, def string, port int) string {
	if addr == "" {
		addr = def
	}
	if a, err := netip.ParseAddr(addr); err == nil {
		return net.JoinHostPort(a.String(), strconv.Itoa(port))
	}
	return addr
}

func ptr[T any](v T) *T { return &v }
