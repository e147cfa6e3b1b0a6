package kubeproxyconfig

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	utilnet "k8s.io/utils/net"
)

// ErrInvalid is what every refusal of Validate wraps.
var ErrInvalid = errors.New("invalid kube-proxy configuration")

// FieldError is a field Validate refuses, named by its path in the file
// (such as "nftables.masqueradeBit").
type FieldError struct {
	Field string
	Value string
	// Reason says what the field must be.
	Reason string
}

func (e *FieldError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Validate refuses a defaulted configuration (see Default) that kube-proxy
// v1.36 refuses on Linux, for the same reasons, naming every field at
// fault (each a *FieldError, joined). It checks what kube-proxy's
// validation checks, per mode: the masquerade bits (iptables', read by
// the iptables and ipvs modes, always; nftables' in nftables mode), the
// conntrack settings, the mode, the client's burst, the sync periods of
// the mode, the addresses (bindAddress an IP; healthzBindAddress, when
// set, and metricsBindAddress an IP and port), nodePortAddresses (CIDRs,
// or "primary" alone), the local traffic detection and its parameters,
// showHiddenMetricsForVersion, the logging format, and the ipvs timeouts
// and excludeCIDRs in ipvs mode.
func Validate(c *Config) error {
	v := &validator{}
	v.bit("iptables.masqueradeBit", c.IPTables.MasqueradeBit)
	if c.Mode == ModeIPVS {
		v.nonNegative("ipvs.tcpTimeout", c.IPVS.TCPTimeout.Duration.Seconds())
		v.nonNegative("ipvs.tcpFinTimeout", c.IPVS.TCPFinTimeout.Duration.Seconds())
		v.nonNegative("ipvs.udpTimeout", c.IPVS.UDPTimeout.Duration.Seconds())
		for i, s := range c.IPVS.ExcludeCIDRs {
			if _, _, err := utilnet.ParseCIDRSloppy(s); err != nil {
				v.add(fmt.Sprintf("ipvs.excludeCIDRs[%d]", i), s, "must be a CIDR")
			}
		}
	}
	if nftablesMode(c.Mode) {
		v.bit("nftables.masqueradeBit", c.NFTables.MasqueradeBit)
	}
	v.conntrack(c)
	if a := c.OOMScoreAdj; a != nil && (*a < -1000 || *a > 1000) {
		v.add("oomScoreAdj", strconv.Itoa(int(*a)), "must be within -1000 and 1000")
	}
	switch c.Mode {
	case "", ModeIPTables, ModeIPVS, ModeNFTables, ModeEBPF, ModeUserspace:
	default:
		v.add("mode", string(c.Mode), "must be iptables, ipvs, nftables, kproxy's ebpf or userspace, or empty (iptables)")
	}
	if c.ClientConnection.Burst < 0 {
		v.add("clientConnection.burst", strconv.Itoa(int(c.ClientConnection.Burst)), "must not be negative")
	}
	if c.ConfigSyncPeriod.Duration <= 0 {
		v.add("configSyncPeriod", c.ConfigSyncPeriod.Duration.String(), "must be greater than 0")
	}
	v.syncPeriods(c)
	if utilnet.ParseIPSloppy(c.BindAddress) == nil {
		v.add("bindAddress", c.BindAddress, "must be an IP address")
	}
	if c.HealthzBindAddress != "" {
		v.hostPort("healthzBindAddress", c.HealthzBindAddress)
	}
	v.hostPort("metricsBindAddress", c.MetricsBindAddress)
	v.nodePortAddresses(c.NodePortAddresses)
	if s := c.ShowHiddenMetricsForVersion; s != "" && s != previousMinor {
		v.add("showHiddenMetricsForVersion", s, "must be empty or "+previousMinor+", the previous minor version")
	}
	v.detectLocal(c)
	v.logging(c)
	return errors.Join(v.errs...)
}

// previousMinor is the version before kube-proxy's own (v1.36), the only
// one whose hidden metrics it shows again.
const previousMinor = "1.35"

type validator struct{ errs []error }

func (v *validator) add(field, value, reason string) {
	v.errs = append(v.errs, &FieldError{Field: field, Value: value, Reason: reason})
}

func (v *validator) bit(field string, b *int32) {
	if b != nil && (*b < 0 || *b > 31) {
		v.add(field, strconv.Itoa(int(*b)), "must be within 0 and 31")
	}
}

func (v *validator) nonNegative(field string, x float64) {
	if x < 0 {
		v.add(field, strconv.FormatFloat(x, 'g', -1, 64)+"s", "must not be negative")
	}
}

func (v *validator) conntrack(c *Config) {
	ct := c.Conntrack
	if ct.MaxPerCore != nil && *ct.MaxPerCore < 0 {
		v.add("conntrack.maxPerCore", strconv.Itoa(int(*ct.MaxPerCore)), "must not be negative")
	}
	if ct.Min != nil && *ct.Min < 0 {
		v.add("conntrack.min", strconv.Itoa(int(*ct.Min)), "must not be negative")
	}
	if d := ct.TCPEstablishedTimeout; d != nil && d.Duration < 0 {
		v.add("conntrack.tcpEstablishedTimeout", d.Duration.String(), "must not be negative")
	}
	if d := ct.TCPCloseWaitTimeout; d != nil && d.Duration < 0 {
		v.add("conntrack.tcpCloseWaitTimeout", d.Duration.String(), "must not be negative")
	}
	if d := ct.UDPTimeout.Duration; d < 0 {
		v.add("conntrack.udpTimeout", d.String(), "must not be negative")
	}
	if d := ct.UDPStreamTimeout.Duration; d < 0 {
		v.add("conntrack.udpStreamTimeout", d.String(), "must not be negative")
	}
}

// syncPeriods checks the sync periods kube-proxy reads: those of the
// mode's section (iptables' for the iptables mode and an empty one).
func (v *validator) syncPeriods(c *Config) {
	section := string(c.Mode)
	period, min := c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration
	switch c.Mode {
	case ModeIPVS:
		period, min = c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration
	case ModeNFTables, ModeEBPF:
		section = "nftables"
		period, min = c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration
	default:
		section = "iptables"
	}
	switch {
	case period <= 0:
		v.add(section+".syncPeriod", period.String(), "must be greater than 0")
	case min < 0:
		v.add(section+".minSyncPeriod", min.String(), "must not be negative")
	case min > period:
		v.add(section+".syncPeriod", period.String(), "must not be less than "+section+".minSyncPeriod ("+min.String()+")")
	}
}

// hostPort checks an address to serve on: an IP and a port (1-65535).
func (v *validator) hostPort(field, s string) {
	host, port, err := net.SplitHostPort(s)
	switch {
	case err != nil:
		v.add(field, s, "must be an IP address and a port, IP:port")
	case utilnet.ParseIPSloppy(host) == nil:
		v.add(field, s, "must be an IP address and a port: "+host+" is no IP address")
	default:
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			v.add(field, s, "must be an IP address and a port: "+port+" is no port")
		}
	}
}

// nodePortAddresses checks the list: CIDRs, or "primary" alone.
func (v *validator) nodePortAddresses(list []string) {
	for i, s := range list {
		field := fmt.Sprintf("nodePortAddresses[%d]", i)
		if s == PrimaryNodePortAddresses {
			if i != 0 || len(list) != 1 {
				v.add(field, s, "\"primary\" must be alone: it cannot be given with CIDRs")
				return
			}
			continue
		}
		if _, _, err := utilnet.ParseCIDRSloppy(s); err != nil {
			v.add(field, s, "must be a CIDR, or \"primary\" alone")
		}
	}
}

func (v *validator) detectLocal(c *Config) {
	switch c.DetectLocalMode {
	case "", LocalClusterCIDR, LocalNodeCIDR:
	case LocalBridgeInterface:
		if c.DetectLocal.BridgeInterface == "" {
			v.add("detectLocal.bridgeInterface", "", "must name the bridge under detectLocalMode BridgeInterface")
		}
	case LocalInterfaceNamePrefix:
		if c.DetectLocal.InterfaceNamePrefix == "" {
			v.add("detectLocal.interfaceNamePrefix", "", "must name the prefix under detectLocalMode InterfaceNamePrefix")
		}
	default:
		v.add("detectLocalMode", string(c.DetectLocalMode), "must be ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix or empty")
	}
	if c.DetectLocalMode != LocalClusterCIDR || c.ClusterCIDR == "" {
		return
	}
	// kube-proxy splits the list on commas and trims nothing.
	cidrs := strings.Split(c.ClusterCIDR, ",")
	v4 := 0
	for i, s := range cidrs {
		ip, _, err := utilnet.ParseCIDRSloppy(s)
		if err != nil {
			v.add(fmt.Sprintf("clusterCIDR[%d]", i), s, "must be a CIDR, such as 10.244.0.0/16 or fd00:10:244::/48")
			return
		}
		if ip.To4() != nil {
			v4++
		}
	}
	if len(cidrs) > 2 || (len(cidrs) == 2 && v4 != 1) {
		v.add("clusterCIDR", c.ClusterCIDR, "must be one CIDR or two of different families")
	}
}

// logging checks the logging settings kube-proxy checks: the format, a
// flush frequency above 0, a verbosity within int32, and vmodule only in
// the text format.
func (v *validator) logging(c *Config) {
	l := c.Logging
	switch l.Format {
	case "", "text", "json":
	default:
		v.add("logging.format", l.Format, "must be text or json")
	}
	if l.FlushFrequency.Duration.Duration < 0 {
		v.add("logging.flushFrequency", l.FlushFrequency.Duration.Duration.String(), "must be greater than 0")
	}
	if len(l.VModule) > 0 && l.Format == "json" {
		v.add("logging.vmodule", "", "is only for the text format")
	}
	for i, m := range l.VModule {
		if m.FilePattern == "" || strings.ContainsAny(m.FilePattern, "=,") {
			v.add(fmt.Sprintf("logging.vmodule[%d].filePattern", i), m.FilePattern, "must be a file pattern, without = or ,")
		}
	}
}
