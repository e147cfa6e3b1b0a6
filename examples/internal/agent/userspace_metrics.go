package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kproxy-dev/kproxy/userspace"
)

// portStatser is a dataplane with per-port counters: the userspace
// backend's.
type portStatser interface{ Stats() []userspace.PortStats }

// portStatsCollector exports the userspace backend's counters, read at
// each scrape, per service port: kproxy_userspace_*, labelled with the
// port's service, port name, family and protocol.
type portStatsCollector struct {
	s                                            portStatser
	active, accepted, bytes, dialErrors, refused *prometheus.Desc
	drained, sessionsDropped, shed, localErrors  *prometheus.Desc
	evicted                                      *prometheus.Desc
}

// userspaceMetrics names the metrics, for the documentation and its test.
var userspaceMetrics = []string{
	"kproxy_userspace_active_connections",
	"kproxy_userspace_accepted_total",
	"kproxy_userspace_bytes_total",
	"kproxy_userspace_dial_errors_total",
	"kproxy_userspace_refused_total",
	"kproxy_userspace_drained_total",
	"kproxy_userspace_udp_sessions_dropped_total",
	"kproxy_userspace_shed_total",
	"kproxy_userspace_local_errors_total",
	"kproxy_userspace_udp_sessions_evicted_total",
}

func newPortStatsCollector(s portStatser) *portStatsCollector {
	labels := []string{"service", "port", "family", "protocol"}
	desc := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(labels, extra...), nil)
	}
	return &portStatsCollector{s: s,
		active:   desc(userspaceMetrics[0], "TCP and SCTP connections open through the service port, and its UDP sessions."),
		accepted: desc(userspaceMetrics[1], "Connections and UDP sessions the service port forwarded to an endpoint."),
		bytes: desc(userspaceMetrics[2], "Bytes moved through the service port: direction \"in\" from clients to endpoints, \"out\" back (UDP payloads included).",
			"direction"),
		dialErrors:      desc(userspaceMetrics[3], "Failed attempts to connect to an endpoint of the service port (each connection tries others)."),
		refused:         desc(userspaceMetrics[4], "Flows of the service port reset or discarded: dropped by a verdict, outside the source ranges, or with every endpoint failing."),
		drained:         desc(userspaceMetrics[5], "Connections closed after their endpoint stopped serving (after the drain timeout), and UDP sessions ended for it."),
		sessionsDropped: desc(userspaceMetrics[6], "Datagrams of new UDP clients dropped because the listener had its most sessions."),
		shed:            desc(userspaceMetrics[7], "New flows of the service port shed because the proxy, or the port, held its most flows."),
		localErrors:     desc(userspaceMetrics[8], "Flows of the service port that failed for the node's own want of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM)."),
		evicted:         desc(userspaceMetrics[9], "UDP sessions of the service port that had no reply yet, ended to make room for a new client."),
	}
}

func (c *portStatsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.active, c.accepted, c.bytes, c.dialErrors, c.refused, c.drained, c.sessionsDropped, c.shed, c.localErrors, c.evicted} {
		ch <- d
	}
}

func (c *portStatsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.s.Stats() {
		l := []string{s.Key.Service, s.Key.Port, s.Key.Family.String(), s.Protocol.Lower()}
		counter := func(d *prometheus.Desc, v uint64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append(l, extra...)...)
		}
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, float64(s.Active), l...)
		counter(c.accepted, s.Accepted)
		counter(c.bytes, s.BytesIn, "in")
		counter(c.bytes, s.BytesOut, "out")
		counter(c.dialErrors, s.DialErrors)
		counter(c.refused, s.Refused)
		counter(c.drained, s.Drained)
		counter(c.sessionsDropped, s.SessionsDropped)
		counter(c.shed, s.Shed)
		counter(c.localErrors, s.LocalErrors)
		counter(c.evicted, s.Evicted)
	}
}
