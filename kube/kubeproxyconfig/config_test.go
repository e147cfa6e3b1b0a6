package kubeproxyconfig

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func parse(t *testing.T, doc string) *Config {
	t.Helper()
	c, warnings, err := Parse([]byte(doc))
	require.NoError(t, err)
	require.Empty(t, warnings)
	return c
}

func settings(r Result) map[string]string {
	out := map[string]string{}
	for _, s := range r.Settings {
		out[s.Field+" -> --"+s.Flag] = s.Value
	}
	return out
}

func ignored(r Result) map[string]string {
	out := map[string]string{}
	for _, i := range r.Ignored {
		out[i.Field] = i.Value
	}
	return out
}

// Every field of kube-proxy's type is either translated, ignored with a
// reason, or passed over as another mode's, whatever the backend and the
// source: a field a newer kube-proxy adds fails this test until it is
// classified.
func TestEveryFieldClassified(t *testing.T) {
	fields := Fields()
	require.Greater(t, len(fields), 50)
	for _, backend := range []string{"nftables", "iptables", "ipvs", "ebpf", "other"} {
		for _, source := range []string{"kubernetes", "file"} {
			r := Translate(&Config{}, Context{Backend: backend, Source: source})
			for _, f := range fields {
				assert.True(t, r.Seen(f), "backend %s, source %s: field %s not classified", backend, source, f)
			}
		}
	}
}

const full = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: /etc/kproxy/kubeconfig
  qps: 7.5
  burst: 20
  contentType: application/vnd.kubernetes.protobuf
  acceptContentTypes: application/json
logging:
  format: json
  verbosity: 4
  flushFrequency: 5s
  options: {json: {splitStream: true}}
hostnameOverride: node-a
bindAddress: 192.0.2.10
healthzBindAddress: 0.0.0.0:20256
metricsBindAddress: 127.0.0.1:20249
bindAddressHardFail: true
enableProfiling: true
showHiddenMetricsForVersion: "1.35"
featureGates: {SomeGate: true}
detectLocalMode: BridgeInterface
detectLocal: {bridgeInterface: cbr0, interfaceNamePrefix: veth}
clusterCIDR: 10.244.0.0/16,fd00:10:244::/48
nodePortAddresses: [192.0.2.0/24, 2001:db8::/64]
oomScoreAdj: -999
configSyncPeriod: 15m
portRange: ""
iptables:
  masqueradeBit: 13
  masqueradeAll: true
  localhostNodePorts: false
  syncPeriod: 45s
  minSyncPeriod: 2s
ipvs:
  scheduler: lc
  syncPeriod: 10s
nftables:
  masqueradeAll: false
  syncPeriod: 20s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpEstablishedTimeout: 24h
  tcpCloseWaitTimeout: 1h
  tcpBeLiberal: true
  udpTimeout: 30s
  udpStreamTimeout: 2m
`

// Every supported field of a file becomes its flag's value; every set
// field kproxy does not use is named, once; the other modes' sections say
// nothing.
func TestTranslateIPTables(t *testing.T) {
	r := Translate(parse(t, full), Context{Source: "kubernetes"})
	assert.Equal(t, map[string]string{
		"mode -> --backend":                                                      "iptables",
		"clientConnection.kubeconfig -> --kubeconfig":                            "/etc/kproxy/kubeconfig",
		"clientConnection.qps -> --kube-api-qps":                                 "7.5",
		"clientConnection.burst -> --kube-api-burst":                             "20",
		"clientConnection.contentType -> --kube-api-content-type":                "application/vnd.kubernetes.protobuf",
		"logging.format -> --log-format":                                         "json",
		"logging.verbosity -> --log-level":                                       "debug",
		"hostnameOverride -> --node-name":                                        "node-a",
		"bindAddress -> --node-ips":                                              "192.0.2.10",
		"healthzBindAddress -> --healthz-bind-address":                           "0.0.0.0:20256",
		"metricsBindAddress -> --metrics-bind-address":                           "127.0.0.1:20249",
		"enableProfiling -> --profiling":                                         "true",
		"detectLocalMode -> --detect-local-mode":                                 "BridgeInterface",
		"detectLocal.bridgeInterface -> --pod-bridge-interface":                  "cbr0",
		"clusterCIDR -> --cluster-cidrs":                                         "10.244.0.0/16,fd00:10:244::/48",
		"nodePortAddresses -> --nodeport-addresses":                              "192.0.2.0/24,2001:db8::/64",
		"iptables.masqueradeBit -> --masquerade-bit":                             "13",
		"iptables.masqueradeAll -> --masquerade-all":                             "true",
		"iptables.localhostNodePorts -> --localhost-nodeports":                   "false",
		"iptables.syncPeriod -> --max-sync-interval":                             "45s",
		"iptables.minSyncPeriod -> --min-sync-interval":                          "2s",
		"conntrack.maxPerCore -> --conntrack-max-per-core":                       "32768",
		"conntrack.min -> --conntrack-min":                                       "131072",
		"conntrack.tcpEstablishedTimeout -> --conntrack-tcp-timeout-established": "24h0m0s",
		"conntrack.tcpCloseWaitTimeout -> --conntrack-tcp-timeout-close-wait":    "1h0m0s",
		"conntrack.tcpBeLiberal -> --conntrack-tcp-be-liberal":                   "true",
		"conntrack.udpTimeout -> --conntrack-udp-timeout":                        "30s",
		"conntrack.udpStreamTimeout -> --conntrack-udp-timeout-stream":           "2m0s",
	}, settings(r))
	assert.Equal(t, map[string]string{
		"clientConnection.acceptContentTypes": "application/json",
		"logging.flushFrequency":              "5s",
		"showHiddenMetricsForVersion":         "1.35",
		"featureGates":                        `{"SomeGate":true}`,
		"detectLocal.interfaceNamePrefix":     "veth",
		"oomScoreAdj":                         "-999",
		"configSyncPeriod":                    "15m0s",
		"logging.options":                     `{"text":{"infoBufferSize":"0"},"json":{"splitStream":true,"infoBufferSize":"0"}}`,
	}, ignored(r))
	for _, i := range r.Ignored {
		assert.NotEmpty(t, i.Reason, i.Field)
	}
}

// The backend's own section is read: nftables' under the nftables mode
// (chosen on the command line over the file's mode), ipvs' with
// iptables' masquerade settings under ipvs, whose unsupported settings are
// named.
func TestTranslateModes(t *testing.T) {
	c := parse(t, full)
	r := Translate(c, Context{Backend: "nftables", Source: "kubernetes"})
	s := settings(r)
	assert.Equal(t, "20s", s["nftables.syncPeriod -> --max-sync-interval"])
	assert.NotContains(t, s, "nftables.masqueradeAll -> --masquerade-all", "false is the default")
	assert.NotContains(t, s, "iptables.masqueradeAll -> --masquerade-all")
	assert.NotContains(t, s, "iptables.syncPeriod -> --max-sync-interval")
	assert.NotContains(t, ignored(r), "ipvs.scheduler", "another mode's section is passed over")

	c.Mode = "ipvs"
	r = Translate(c, Context{Source: "kubernetes"})
	s = settings(r)
	assert.Equal(t, "ipvs", s["mode -> --backend"])
	assert.Equal(t, "10s", s["ipvs.syncPeriod -> --max-sync-interval"])
	assert.Equal(t, "true", s["iptables.masqueradeAll -> --masquerade-all"])
	assert.NotContains(t, s, "iptables.syncPeriod -> --max-sync-interval")
	assert.NotContains(t, s, "iptables.localhostNodePorts -> --localhost-nodeports")
	assert.Equal(t, "lc", ignored(r)["ipvs.scheduler"])
}

// A backend kube-proxy does not have reads the section of the file's
// mode, for which the file was written, else iptables'.
func TestTranslateOtherBackend(t *testing.T) {
	c := parse(t, full)
	c.Mode = "nftables"
	s := settings(Translate(c, Context{Backend: "ebpf", Source: "kubernetes"}))
	assert.Equal(t, "20s", s["nftables.syncPeriod -> --max-sync-interval"])
	assert.NotContains(t, s, "iptables.masqueradeAll -> --masquerade-all")

	c.Mode = ""
	s = settings(Translate(c, Context{Backend: "ebpf", Source: "kubernetes"}))
	assert.Equal(t, "true", s["iptables.masqueradeAll -> --masquerade-all"])
	assert.NotContains(t, s, "nftables.syncPeriod -> --max-sync-interval")
}

// With another source than kubernetes, the client connection is named as
// ignored.
func TestTranslateOtherSource(t *testing.T) {
	r := Translate(parse(t, full), Context{Source: "file"})
	assert.NotContains(t, settings(r), "clientConnection.kubeconfig -> --kubeconfig")
	ig := ignored(r)
	assert.Equal(t, "/etc/kproxy/kubeconfig", ig["clientConnection.kubeconfig"])
	assert.Equal(t, "20", ig["clientConnection.burst"])
}

// kubeadm's ConfigMap, read as written: its kubeconfig and cluster CIDR
// are taken, and nothing else is set.
func TestKubeadmConfig(t *testing.T) {
	c, warnings, err := Load(filepath.Join("testdata", "kubeadm.yaml"))
	require.NoError(t, err)
	assert.Empty(t, warnings)
	r := Translate(c, Context{Source: "kubernetes"})
	assert.Equal(t, map[string]string{
		"clientConnection.kubeconfig -> --kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf",
		"clusterCIDR -> --cluster-cidrs":              "10.244.0.0/16",
	}, settings(r))
	assert.Empty(t, r.Ignored)
}

func TestParseErrors(t *testing.T) {
	_, _, err := Parse([]byte("apiVersion: v1\nkind: ConfigMap\n"))
	assert.ErrorContains(t, err, "want apiVersion kubeproxy.config.k8s.io/v1alpha1, kind KubeProxyConfiguration")

	_, _, err = Parse([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: [1\n"))
	assert.Error(t, err)

	// An unknown field is named and the rest is read, as kube-proxy reads
	// it.
	c, warnings, err := Parse([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" +
		"clusterCIDRs: 10.0.0.0/8\nmode: ipvs\niptables: {masqueradeAll: true, syncPerod: 1s}\n"))
	require.NoError(t, err)
	assert.Equal(t, []string{`unknown field "clusterCIDRs" (ignored)`, `unknown field "iptables.syncPerod" (ignored)`}, warnings)
	assert.EqualValues(t, "ipvs", c.Mode)
	assert.True(t, c.IPTables.MasqueradeAll)

	_, _, err = Load(filepath.Join(t.TempDir(), "absent.yaml"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// Resolve reads a file as kube-proxy does: defaulted, then translated.
// Addresses without a port get kube-proxy's ports; an empty clusterCIDR
// under ClusterCIDR tells no traffic local, with a warning, rather than
// refusing to start; the nftables mode serves node ports on the primary
// addresses; conntrack is sized and timed unless set to 0; the iptables
// mode serves node ports on 127.0.0.1. The fields named ignored are those
// the file sets, never a default.
func TestResolve(t *testing.T) {
	r, err := Resolve(parse(t, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
healthzBindAddress: 0.0.0.0
metricsBindAddress: 0.0.0.0
detectLocalMode: ClusterCIDR
`), Context{Source: "kubernetes"})
	require.NoError(t, err)
	s := settings(r)
	assert.Equal(t, "0.0.0.0:10256", s["healthzBindAddress -> --healthz-bind-address"])
	assert.Equal(t, "0.0.0.0:10249", s["metricsBindAddress -> --metrics-bind-address"])
	assert.NotContains(t, s, "detectLocalMode -> --detect-local-mode")
	assert.Len(t, r.Warnings, 1)
	assert.Contains(t, r.Warnings[0], "clusterCIDR is empty")
	assert.Equal(t, "primary", s["nodePortAddresses -> --nodeport-addresses"])
	assert.Equal(t, "32768", s["conntrack.maxPerCore -> --conntrack-max-per-core"])
	assert.Equal(t, "131072", s["conntrack.min -> --conntrack-min"])
	assert.Equal(t, "24h0m0s", s["conntrack.tcpEstablishedTimeout -> --conntrack-tcp-timeout-established"])
	assert.Equal(t, "1h0m0s", s["conntrack.tcpCloseWaitTimeout -> --conntrack-tcp-timeout-close-wait"])
	assert.Equal(t, "14", s["nftables.masqueradeBit -> --masquerade-bit"])
	assert.Empty(t, r.Ignored, "no default is named ignored")

	// kubeadm's file: the iptables mode, node ports on 127.0.0.1, node
	// ports on every address.
	c, _, err := Load(filepath.Join("testdata", "kubeadm.yaml"))
	require.NoError(t, err)
	r, err = Resolve(c, Context{Source: "kubernetes"})
	require.NoError(t, err)
	s = settings(r)
	assert.Equal(t, "iptables", s["mode -> --backend"])
	assert.Equal(t, "true", s["iptables.localhostNodePorts -> --localhost-nodeports"])
	assert.NotContains(t, s, "nodePortAddresses -> --nodeport-addresses")
	assert.Equal(t, "ClusterCIDR", s["detectLocalMode -> --detect-local-mode"])
	assert.Empty(t, r.Warnings)

	// The command line's backend is the mode the file is defaulted for.
	r, err = Resolve(c, Context{Source: "kubernetes", Backend: "nftables"})
	require.NoError(t, err)
	assert.Equal(t, "primary", settings(r)["nodePortAddresses -> --nodeport-addresses"])
	assert.Empty(t, c.Mode, "the file is not changed")

	// Explicit zeros stay: nothing tuned.
	r, err = Resolve(parse(t, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
`), Context{Source: "kubernetes"})
	require.NoError(t, err)
	s = settings(r)
	assert.Equal(t, "0", s["conntrack.maxPerCore -> --conntrack-max-per-core"])
	assert.Equal(t, "0s", s["conntrack.tcpEstablishedTimeout -> --conntrack-tcp-timeout-established"])
	assert.Equal(t, "false", s["iptables.localhostNodePorts -> --localhost-nodeports"])

	// What kube-proxy refuses is refused, naming the field.
	_, err = Resolve(parse(t, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
healthzBindAddress: node-1:10256
conntrack: {maxPerCore: -1}
`), Context{Source: "kubernetes"})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, `healthzBindAddress "node-1:10256"`)
	assert.ErrorContains(t, err, `conntrack.maxPerCore "-1"`)
}
