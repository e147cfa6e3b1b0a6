package userspace

import (
	"sync/atomic"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// PortStats are the counters of one service port since the proxy began
// to serve it.
type PortStats struct {
	Key      servicelb.ServicePortKey
	Protocol servicelb.Protocol
	// Active is the number of TCP and SCTP connections open through the
	// port, and of its UDP sessions.
	Active int64
	// Accepted counts the connections and UDP sessions forwarded to an
	// endpoint.
	Accepted uint64
	// TakenOver counts the TCP connections an older process handed over
	// (Options.TakeOver), carried on without a break.
	TakenOver uint64
	// BytesIn counts the bytes from clients to endpoints, BytesOut those
	// from endpoints to clients (UDP payloads included).
	BytesIn, BytesOut uint64
	// DialErrors counts the failed attempts to connect to an endpoint.
	DialErrors uint64
	// Refused counts the flows a verdict dropped that the proxy reset
	// (TCP, SCTP) or discarded (UDP), those from outside a load-balancer
	// frontend's source ranges included, and the connections whose every
	// attempt to reach an endpoint failed.
	Refused uint64
	// Drained counts the connections closed because their endpoint
	// stopped serving (after Options.DrainTimeout) and the UDP sessions
	// closed for it at once.
	Drained uint64
	// SessionsDropped counts the datagrams of new UDP clients dropped
	// because the listener's sessions were at Options.MaxUDPSessions,
	// every one of them replied to.
	SessionsDropped uint64
	// Evicted counts the UDP sessions that had no reply yet, ended to make
	// room for a new client when the listener's sessions or the flow
	// budget were full.
	Evicted uint64
	// Shed counts the new flows refused because the proxy held
	// Options.MaxFlows, or the port Options.MaxPortFlows.
	Shed uint64
	// LocalErrors counts the flows that failed for the node's own want of
	// descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), which are
	// no endpoint's failure.
	LocalErrors uint64
}

// portStats are a service port's counters, updated from the data path.
type portStats struct {
	active                       atomic.Int64
	accepted, adopted            atomic.Uint64
	bytesIn, bytesOut            atomic.Uint64
	dialErrors, refused, drained atomic.Uint64
	sessionsDropped              atomic.Uint64
	shed, localErrors, evicted   atomic.Uint64
}

func (s *portStats) snapshot(k servicelb.ServicePortKey, p servicelb.Protocol) PortStats {
	return PortStats{
		Key: k, Protocol: p,
		Active: s.active.Load(), Accepted: s.accepted.Load(), TakenOver: s.adopted.Load(),
		BytesIn: s.bytesIn.Load(), BytesOut: s.bytesOut.Load(),
		DialErrors: s.dialErrors.Load(), Refused: s.refused.Load(), Drained: s.drained.Load(),
		SessionsDropped: s.sessionsDropped.Load(), Shed: s.shed.Load(), LocalErrors: s.localErrors.Load(),
		Evicted: s.evicted.Load(),
	}
}
