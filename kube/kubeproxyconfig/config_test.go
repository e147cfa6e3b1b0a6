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
	r := Translate(parse(t, full), Context{Default: "nftables", Source: "kubernetes"})
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
	r := Translate(c, Context{Default: "nftables", Source: "kubernetes"})
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
