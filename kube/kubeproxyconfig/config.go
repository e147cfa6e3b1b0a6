// Package kubeproxyconfig reads kube-proxy's configuration file (a
// KubeProxyConfiguration of kubeproxy.config.k8s.io/v1alpha1, with
// kube-proxy's own published types) and kube-proxy's command line
// (Options), defaults and validates the configuration as kube-proxy v1.36
// does on Linux (Default, Validate), and translates it into the kproxy
// binary's flags (Resolve, Translate): every field kproxy supports
// becomes the value of a flag, and every other field that is set is
// named, with the reason kproxy ignores it.
//
// A file means what it means to kube-proxy: a file without a mode is the
// iptables mode's, its conntrack settings size and time the conntrack
// table unless set to 0, iptables' localhostNodePorts is on, and the
// nftables mode serves node ports on the node's primary addresses.
// Where kproxy departs from kube-proxy: masqueradeBit 0 means kproxy's
// default bit, 14 (kube-proxy: bit 0), because servicelb.NodeConfig reads
// a zero MasqueradeBit as its default and has no way yet to say bit 0;
// the modes also take kproxy's ebpf and userspace.
//
// The mode-specific sections are read as kube-proxy reads them: the
// nftables mode reads nftables, the iptables mode iptables, the ipvs mode
// ipvs and iptables' masquerade settings; the sections of other modes (and
// winkernel's) are ignored without a word, as kube-proxy ignores them. A
// backend kube-proxy does not have (ebpf) reads the section of the file's
// mode, for which the file was written, else iptables'.
package kubeproxyconfig

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// The type the file must declare.
const (
	APIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	Kind       = "KubeProxyConfiguration"
)

// Config is kube-proxy's configuration type.
type Config = kpv1alpha1.KubeProxyConfiguration

// Load reads a KubeProxyConfiguration from a YAML or JSON file. A field
// the type does not have is not an error, as in kube-proxy: it comes back
// as a warning naming it.
func Load(path string) (*Config, []string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	c, warnings, err := Parse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, warnings, nil
}

// Write writes c to a file as YAML, as kube-proxy's --write-config-to
// writes the configuration it runs with.
func Write(path string, c *Config) error {
	out := c.DeepCopy()
	out.APIVersion, out.Kind = APIVersion, Kind
	data, err := yaml.Marshal(out)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// Parse decodes a KubeProxyConfiguration.
func Parse(data []byte) (*Config, []string, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return nil, nil, err
	}
	if tm.APIVersion != APIVersion || tm.Kind != Kind {
		return nil, nil, fmt.Errorf("apiVersion %q, kind %q: want apiVersion %s, kind %s", tm.APIVersion, tm.Kind, APIVersion, Kind)
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err == nil {
		return &c, nil, nil
	} else if !isUnknownField(err) {
		return nil, nil, err
	}
	// Unknown fields: decode what is known and name the rest, as
	// kube-proxy does when strict decoding fails.
	var warnings []string
	for _, f := range unknownFields(data) {
		warnings = append(warnings, fmt.Sprintf("unknown field %q (ignored)", f))
	}
	c = Config{}
	if err := yaml.Unmarshal(data, &c); err != nil {
		return nil, nil, err
	}
	return &c, warnings, nil
}

func isUnknownField(err error) bool { return strings.Contains(err.Error(), "unknown field") }

// unknownFields returns the paths of the document's fields the type does
// not have.
func unknownFields(data []byte) []string {
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil
	}
	var out []string
	walkUnknown(reflect.TypeFor[Config](), doc, "", &out)
	sort.Strings(out)
	return out
}

func walkUnknown(t reflect.Type, doc map[string]any, prefix string, out *[]string) {
	fields := jsonFields(t)
	for name, v := range doc {
		ft, ok := fields[name]
		switch {
		case !ok:
			*out = append(*out, prefix+name)
		case ft.Kind() == reflect.Struct && !isLeaf(ft):
			if m, ok := v.(map[string]any); ok {
				walkUnknown(ft, m, prefix+name+".", out)
			}
		}
	}
}

// jsonFields maps the JSON names of a struct's fields to their types,
// inlined structs' fields included.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if strings.Contains(opts, "inline") || (f.Anonymous && name == "") {
			for n, ft := range jsonFields(f.Type) {
				out[n] = ft
			}
			continue
		}
		if name == "" || name == "-" {
			continue
		}
		out[name] = f.Type
	}
	return out
}

// isLeaf reports whether a struct type is a value of its own (a
// duration), not a section.
func isLeaf(t reflect.Type) bool {
	return t == reflect.TypeFor[metav1.Duration]() || t.Name() == "TimeOrMetaDuration"
}

// Context is what decides how a file is read besides the file: the
// command line's choices.
type Context struct {
	// Backend is the --backend given on the command line; empty means the
	// file's mode decides (iptables, kube-proxy's default, when it names
	// none).
	Backend string
	// Source is the kproxy source in use (kubernetes, consul, file): the
	// client connection settings apply to the kubernetes source only.
	Source string
}

// Setting is a flag value the file gives.
type Setting struct {
	// Field is the file's field, such as "iptables.masqueradeAll".
	Field string
	// Flag is the kproxy flag it sets, without dashes.
	Flag  string
	Value string
}

// Ignored is a field that is set in the file and that kproxy does not
// use.
type Ignored struct {
	Field  string
	Value  string
	Reason string
}

// Result is what a file means to kproxy.
type Result struct {
	Settings []Setting
	Ignored  []Ignored
	// Warnings are what kube-proxy would warn of in this configuration,
	// such as local traffic told by an empty clusterCIDR.
	Warnings []string
	// seen holds every field path the translation looked at, set or not:
	// a test checks that no field of the type is left out.
	seen map[string]bool
}

// Resolve is what a file means to kproxy, as it means it to kube-proxy:
// the file is defaulted as kube-proxy defaults it (Default) for the mode
// of the backend the command line names (ctx.Backend, when it is one of
// kube-proxy's modes; else the file's), refused where kube-proxy refuses
// it (Validate: every fault, each a *FieldError), and translated
// (Translate): the flag values are those of the defaulted file, and the
// fields ignored are those the file itself sets. c is not changed.
func Resolve(c *Config, ctx Context) (Result, error) {
	ignored := Translate(c.DeepCopy(), ctx).Ignored
	d := c.DeepCopy()
	switch m := kpv1alpha1.ProxyMode(ctx.Backend); m {
	case ModeIPTables, ModeIPVS, ModeNFTables:
		d.Mode = m
	}
	Default(d)
	if err := Validate(d); err != nil {
		return Result{}, err
	}
	r := Translate(d, ctx)
	r.Ignored = ignored
	return r, nil
}

// Translate turns a KubeProxyConfiguration into kproxy flag values and
// the list of set fields it ignores, as it stands: Resolve defaults and
// validates it first.
func Translate(c *Config, ctx Context) Result {
	t := &translator{r: Result{seen: map[string]bool{}}}
	backend := ctx.Backend
	if backend == "" {
		backend = string(c.Mode)
	}
	t.general(c, ctx)
	t.modes(c, backend)
	t.conntrack(c)
	return t.r
}

type translator struct{ r Result }

// set records a flag value for a field, when the value is set.
func (t *translator) set(field, flag string, v any) {
	t.r.seen[field] = true
	s, ok := text(v)
	if !ok {
		return
	}
	t.r.Settings = append(t.r.Settings, Setting{Field: field, Flag: flag, Value: s})
}

// ignore records a field kproxy does not use, when it is set.
func (t *translator) ignore(field string, v any, reason string) {
	t.r.seen[field] = true
	if reflect.ValueOf(v).IsZero() {
		return
	}
	s, ok := text(v)
	if !ok {
		s = jsonText(v)
	}
	t.r.Ignored = append(t.r.Ignored, Ignored{Field: field, Value: s, Reason: reason})
}

// silent records fields kube-proxy itself ignores in this mode.
func (t *translator) silent(fields ...string) {
	for _, f := range fields {
		t.r.seen[f] = true
	}
}

// text formats a set value as a flag takes it; ok is false when the value
// is not set (zero, or a nil pointer).
func text(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, x != ""
	case bool:
		return strconv.FormatBool(x), x
	case *bool:
		if x == nil {
			return "", false
		}
		return strconv.FormatBool(*x), true
	case *int32:
		if x == nil {
			return "", false
		}
		return strconv.Itoa(int(*x)), true
	case int32:
		return strconv.Itoa(int(x)), x != 0
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32), x != 0
	case metav1.Duration:
		return x.Duration.String(), x.Duration != 0
	case *metav1.Duration:
		if x == nil {
			return "", false
		}
		return x.Duration.String(), true
	case []string:
		return strings.Join(x, ","), len(x) > 0
	}
	return "", false
}

func (t *translator) general(c *Config, ctx Context) {
	if c.Mode != "" {
		t.set("mode", "backend", string(c.Mode))
	} else {
		t.silent("mode")
	}
	t.ignore("featureGates", c.FeatureGates, "kproxy has no feature gates: what it supports is always on")
	t.client(c, ctx)
	t.logging(c)
	t.set("hostnameOverride", "node-name", c.HostnameOverride)
	if a := strings.TrimSpace(c.BindAddress); a == "0.0.0.0" || a == "::" {
		// kube-proxy's "unset".
		t.silent("bindAddress")
	} else {
		t.set("bindAddress", "node-ips", a)
	}
	t.set("healthzBindAddress", "healthz-bind-address", c.HealthzBindAddress)
	t.set("metricsBindAddress", "metrics-bind-address", c.MetricsBindAddress)
	// kproxy always stops when it cannot bind: true is what it does.
	t.silent("bindAddressHardFail")
	t.set("enableProfiling", "profiling", c.EnableProfiling)
	t.ignore("showHiddenMetricsForVersion", c.ShowHiddenMetricsForVersion, "kproxy hides no metrics")
	if c.DetectLocalMode == LocalClusterCIDR && strings.TrimSpace(c.ClusterCIDR) == "" {
		// kube-proxy then tells no traffic local, and says so.
		t.silent("detectLocalMode")
		t.r.Warnings = append(t.r.Warnings, "detectLocalMode is ClusterCIDR, but clusterCIDR is empty: no traffic is told local, and none is masqueraded for coming from outside the cluster, as in kube-proxy")
	} else {
		t.set("detectLocalMode", "detect-local-mode", string(c.DetectLocalMode))
	}
	t.detectLocal(c)
	t.set("clusterCIDR", "cluster-cidrs", c.ClusterCIDR)
	t.set("nodePortAddresses", "nodeport-addresses", c.NodePortAddresses)
	t.ignore("oomScoreAdj", c.OOMScoreAdj, "kproxy leaves its OOM score to what starts it: the kubelet gives a system-node-critical pod -997, and the systemd unit sets OOMScoreAdjust=")
	t.ignore("configSyncPeriod", c.ConfigSyncPeriod, "kproxy's informers never relist on a timer: their watches keep them current")
	t.ignore("portRange", c.PortRange, "unused by kube-proxy too (the userspace mode's)")
	t.ignore("windowsRunAsService", c.WindowsRunAsService, "Windows only")
	t.silent("winkernel.networkName", "winkernel.sourceVip", "winkernel.enableDSR",
		"winkernel.rootHnsEndpointName", "winkernel.forwardHealthCheckVip")
}

func (t *translator) client(c *Config, ctx Context) {
	cc := c.ClientConnection
	if ctx.Source != "kubernetes" {
		reason := "the client connection is the kubernetes source's; --source is " + ctx.Source
		t.ignore("clientConnection.kubeconfig", cc.Kubeconfig, reason)
		t.ignore("clientConnection.qps", cc.QPS, reason)
		t.ignore("clientConnection.burst", cc.Burst, reason)
		t.ignore("clientConnection.contentType", cc.ContentType, reason)
	} else {
		t.set("clientConnection.kubeconfig", "kubeconfig", cc.Kubeconfig)
		t.set("clientConnection.qps", "kube-api-qps", cc.QPS)
		t.set("clientConnection.burst", "kube-api-burst", cc.Burst)
		t.set("clientConnection.contentType", "kube-api-content-type", cc.ContentType)
	}
	t.ignore("clientConnection.acceptContentTypes", cc.AcceptContentTypes, "kproxy's client accepts what it sends (contentType)")
}

func (t *translator) logging(c *Config) {
	l := c.Logging
	t.set("logging.format", "log-format", l.Format)
	switch {
	case l.Verbosity >= 4:
		t.set("logging.verbosity", "log-level", "debug")
	case l.Verbosity > 0:
		t.set("logging.verbosity", "log-level", "info")
	default:
		t.silent("logging.verbosity")
	}
	t.ignore("logging.flushFrequency", l.FlushFrequency.Duration, "kproxy's logs are not buffered")
	t.ignore("logging.vmodule", l.VModule, "kproxy has one level for all its logs (--log-level)")
	t.r.seen["logging.options"] = true
	if routing(l.Options.Text.OutputRoutingOptions) || routing(l.Options.JSON.OutputRoutingOptions) {
		t.r.Ignored = append(t.r.Ignored, Ignored{Field: "logging.options", Value: jsonText(l.Options),
			Reason: "kproxy writes every log line to stderr, unbuffered"})
	}
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// routing reports whether output routing options are set: a buffer of
// size "0" is none.
func routing(o logsapi.OutputRoutingOptions) bool {
	return o.SplitStream || o.InfoBufferSize.Value() != 0
}

func (t *translator) detectLocal(c *Config) {
	bridge, prefix := c.DetectLocal.BridgeInterface, c.DetectLocal.InterfaceNamePrefix
	why := fmt.Sprintf("detectLocalMode is %q", c.DetectLocalMode)
	if c.DetectLocalMode == "BridgeInterface" {
		t.set("detectLocal.bridgeInterface", "pod-bridge-interface", bridge)
	} else {
		t.ignore("detectLocal.bridgeInterface", bridge, why)
	}
	if c.DetectLocalMode == "InterfaceNamePrefix" {
		t.set("detectLocal.interfaceNamePrefix", "pod-interface-name-prefix", prefix)
	} else {
		t.ignore("detectLocal.interfaceNamePrefix", prefix, why)
	}
}

// modes reads the section of the backend's mode and passes over the
// others'.
func (t *translator) modes(c *Config, backend string) {
	ipt, ipvs, nft := c.IPTables, c.IPVS, c.NFTables
	switch section(backend, string(c.Mode)) {
	case "nftables":
		t.set("nftables.masqueradeBit", "masquerade-bit", nft.MasqueradeBit)
		t.set("nftables.masqueradeAll", "masquerade-all", nft.MasqueradeAll)
		t.set("nftables.syncPeriod", "max-sync-interval", nft.SyncPeriod)
		t.set("nftables.minSyncPeriod", "min-sync-interval", nft.MinSyncPeriod)
		t.silentIPTables()
		t.silentIPVS()
	case "ipvs":
		t.set("iptables.masqueradeBit", "masquerade-bit", ipt.MasqueradeBit)
		t.set("iptables.masqueradeAll", "masquerade-all", ipt.MasqueradeAll)
		t.silent("iptables.localhostNodePorts", "iptables.syncPeriod", "iptables.minSyncPeriod")
		t.set("ipvs.syncPeriod", "max-sync-interval", ipvs.SyncPeriod)
		t.set("ipvs.minSyncPeriod", "min-sync-interval", ipvs.MinSyncPeriod)
		t.set("ipvs.strictARP", "ipvs-strict-arp", ipvs.StrictARP)
		t.ignore("ipvs.scheduler", ipvs.Scheduler, "kproxy's ipvs backend schedules each service as it asks (annotation kproxy.dev/scheduler), round robin by default")
		t.ignore("ipvs.excludeCIDRs", ipvs.ExcludeCIDRs, "not needed: kproxy's ipvs backend touches only the virtual servers on its own link and marks")
		const timeouts = "kproxy leaves the kernel's IPVS timeouts as they are"
		t.ignore("ipvs.tcpTimeout", ipvs.TCPTimeout, timeouts)
		t.ignore("ipvs.tcpFinTimeout", ipvs.TCPFinTimeout, timeouts)
		t.ignore("ipvs.udpTimeout", ipvs.UDPTimeout, timeouts)
		t.silentNFTables()
	default:
		t.set("iptables.masqueradeBit", "masquerade-bit", ipt.MasqueradeBit)
		t.set("iptables.masqueradeAll", "masquerade-all", ipt.MasqueradeAll)
		t.set("iptables.localhostNodePorts", "localhost-nodeports", ipt.LocalhostNodePorts)
		t.set("iptables.syncPeriod", "max-sync-interval", ipt.SyncPeriod)
		t.set("iptables.minSyncPeriod", "min-sync-interval", ipt.MinSyncPeriod)
		t.silentIPVS()
		t.silentNFTables()
	}
}

// section returns the mode whose section is read for the backend: its
// own; for a backend kube-proxy does not have (ebpf), the file's mode,
// for which the file was written; else iptables', kube-proxy's default
// mode's.
func section(backend, mode string) string {
	for _, m := range []string{backend, mode} {
		switch m {
		case "iptables", "ipvs", "nftables":
			return m
		}
	}
	return "iptables"
}

func (t *translator) silentIPTables() {
	t.silent("iptables.masqueradeBit", "iptables.masqueradeAll", "iptables.localhostNodePorts",
		"iptables.syncPeriod", "iptables.minSyncPeriod")
}

func (t *translator) silentIPVS() {
	t.silent("ipvs.syncPeriod", "ipvs.minSyncPeriod", "ipvs.scheduler", "ipvs.excludeCIDRs", "ipvs.strictARP",
		"ipvs.tcpTimeout", "ipvs.tcpFinTimeout", "ipvs.udpTimeout")
}

func (t *translator) silentNFTables() {
	t.silent("nftables.masqueradeBit", "nftables.masqueradeAll", "nftables.syncPeriod", "nftables.minSyncPeriod")
}

func (t *translator) conntrack(c *Config) {
	ct := c.Conntrack
	t.set("conntrack.maxPerCore", "conntrack-max-per-core", ct.MaxPerCore)
	t.set("conntrack.min", "conntrack-min", ct.Min)
	t.set("conntrack.tcpEstablishedTimeout", "conntrack-tcp-timeout-established", ct.TCPEstablishedTimeout)
	t.set("conntrack.tcpCloseWaitTimeout", "conntrack-tcp-timeout-close-wait", ct.TCPCloseWaitTimeout)
	t.set("conntrack.tcpBeLiberal", "conntrack-tcp-be-liberal", ct.TCPBeLiberal)
	t.set("conntrack.udpTimeout", "conntrack-udp-timeout", ct.UDPTimeout)
	t.set("conntrack.udpStreamTimeout", "conntrack-udp-timeout-stream", ct.UDPStreamTimeout)
}

// Fields returns the paths of every leaf field of the type, as a file
// writes them ("iptables.masqueradeAll").
func Fields() []string {
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for name, ft := range jsonFields(t) {
			if name == "apiVersion" || name == "kind" {
				continue
			}
			if ft.Kind() == reflect.Struct && !isLeaf(ft) && !strings.HasPrefix(prefix+name, "logging.") {
				walk(ft, prefix+name+".")
				continue
			}
			out = append(out, prefix+name)
		}
	}
	walk(reflect.TypeFor[Config](), "")
	sort.Strings(out)
	return out
}

// Seen reports whether the translation looked at a field path.
func (r Result) Seen(field string) bool { return r.seen[field] }
