package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// The operator's questions, answered on the metrics address beside
// /metrics, as kube-proxy answers /configz there: /configz, the
// configuration in effect; /state, what the proxy serves, what it leaves
// out and why, and how its last sync went; /explain, what it decides for
// a flow and why (servicelb's Explain, on the state the backend last
// applied). `kproxy explain` and `kproxy state` ask them.

// StateDump is what /state answers: the node and services of the state
// the backend last applied (enough to explain a flow offline, with
// `kproxy explain --state`), the clashes over frontends, the objects left
// out with their reasons, and the last sync.
type StateDump struct {
	Backend   string               `json:"backend"`
	Node      servicelb.NodeConfig `json:"node"`
	Services  []servicelb.Service  `json:"services"`
	Conflicts []ConflictDump       `json:"conflicts"`
	LeftOut   []LeftOut            `json:"leftOut"`
	LastSync  *SyncDump            `json:"lastSync,omitempty"`
}

// ConflictDump is a clash over a frontend: the service served there and
// those that are not.
type ConflictDump struct {
	Frontend string   `json:"frontend"`
	Winner   string   `json:"winner"`
	Losers   []string `json:"losers"`
}

// LeftOut is an object a source, the runner or the backend refused, as
// last reported: a service that is not served (whole or in part).
type LeftOut struct {
	Object string    `json:"object"`
	Source string    `json:"source"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// SyncDump is how the last sync went.
type SyncDump struct {
	At       time.Time `json:"at"`
	Duration string    `json:"duration"`
	Full     bool      `json:"full"`
	Services int       `json:"services"`
	Error    string    `json:"error,omitempty"`
}

// maxLeftOut bounds the objects left out that /state keeps.
const maxLeftOut = 1000

// inspection keeps what /state tells beyond the runner's state.
type inspection struct {
	mu      sync.Mutex
	leftOut map[string]LeftOut
	last    *SyncDump
}

func (in *inspection) leave(object, source string, err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.leftOut == nil {
		in.leftOut = map[string]LeftOut{}
	}
	if _, ok := in.leftOut[object]; !ok && len(in.leftOut) >= maxLeftOut {
		return
	}
	in.leftOut[object] = LeftOut{Object: object, Source: source, Reason: err.Error(), At: time.Now()}
}

// served forgets the objects a successful sync applied whole.
func (in *inspection) served(st *servicelb.State) {
	in.mu.Lock()
	defer in.mu.Unlock()
	conflicted := map[string]bool{}
	for _, c := range st.Conflicts() {
		for _, l := range c.Losers {
			conflicted[l] = true
		}
	}
	for name, l := range in.leftOut {
		if _, ok := st.Service(name); ok && !conflicted[name] && l.Source != "backend" {
			delete(in.leftOut, name)
		}
	}
}

func (in *inspection) synced(r servicelb.SyncResult) {
	d := &SyncDump{At: r.End(), Duration: r.Duration.String(), Full: r.Full, Services: r.Services}
	if r.Err != nil {
		d.Error = r.Err.Error()
	}
	in.mu.Lock()
	in.last = d
	in.mu.Unlock()
}

// dump returns the state dump of st (nil: nothing applied yet).
func (in *inspection) dump(backend string, st *servicelb.State) StateDump {
	d := StateDump{Backend: backend, Services: []servicelb.Service{}, Conflicts: []ConflictDump{}, LeftOut: []LeftOut{}}
	if st != nil {
		d.Node = st.Node()
		for _, s := range st.Services() {
			d.Services = append(d.Services, *s)
		}
		for _, c := range st.Conflicts() {
			d.Conflicts = append(d.Conflicts, ConflictDump(c))
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, l := range in.leftOut {
		d.LeftOut = append(d.LeftOut, l)
	}
	slices.SortFunc(d.LeftOut, func(a, b LeftOut) int { return strings.Compare(a.Object, b.Object) })
	d.LastSync = in.last
	return d
}

// inspectHandler serves /configz, /state, /explain and /trace; state
// returns the state the backend last applied (nil before the first
// sync); the backend, when it can, gives its reading of the kernel for an
// explained flow (servicelb.FlowChecker) and traces packets
// (servicelb.Tracer).
func inspectHandler(cfg Config, in *inspection, state func() *servicelb.State, backend servicelb.Proxier) http.Handler {
	kernel, _ := backend.(servicelb.FlowChecker)
	tracer, _ := backend.(servicelb.Tracer)
	mux := http.NewServeMux()
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]Config{"kproxy": cfg})
	})
	mux.HandleFunc("/state", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, in.dump(cfg.Backend, state()))
	})
	mux.HandleFunc("/explain", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		f, err := ParseFlow(q.Get("from"), q.Get("to"), q.Get("protocol"), q.Get("origin"), q.Get("in"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		st := state()
		if st == nil {
			http.Error(w, "nothing applied yet: the first sync has not succeeded", http.StatusServiceUnavailable)
			return
		}
		e := st.Explain(f)
		var kc *servicelb.KernelCheck
		if kernel != nil {
			c, err := kernel.CheckFlow(r.Context(), &e)
			if err != nil {
				http.Error(w, "read the kernel: "+err.Error(), http.StatusInternalServerError)
				return
			}
			kc = &c
		}
		if q.Get("format") == "json" {
			writeJSON(w, explainReply{&e, kc})
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, e.Text())
		if kc != nil {
			fmt.Fprint(w, kc.Text())
		}
	})
	mux.HandleFunc("/trace", func(w http.ResponseWriter, r *http.Request) {
		if tracer == nil {
			http.Error(w, "the "+cfg.Backend+" backend cannot trace packets: nftables and iptables can", http.StatusNotImplemented)
			return
		}
		q := r.URL.Query()
		f, err := ParseFlow(q.Get("from"), q.Get("to"), q.Get("protocol"), "", "")
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		timeout := DefaultTraceTimeout
		if s := q.Get("timeout"); s != "" {
			if timeout, err = time.ParseDuration(s); err != nil || timeout <= 0 || timeout > MaxTraceTimeout {
				http.Error(w, fmt.Sprintf("timeout %q: a duration up to %s", s, MaxTraceTimeout), http.StatusBadRequest)
				return
			}
		}
		// The answer comes when a packet does: past the server's write
		// timeout.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(timeout + 5*time.Second))
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		tr, err := tracer.Trace(ctx, f)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			http.Error(w, fmt.Sprintf("no packet of the flow within %s", timeout), http.StatusGatewayTimeout)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if q.Get("format") == "json" {
			writeJSON(w, &tr)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, tr.Text())
	})
	return mux
}

// DefaultTraceTimeout and MaxTraceTimeout bound how long /trace waits for
// a packet.
const (
	DefaultTraceTimeout = 30 * time.Second
	MaxTraceTimeout     = 5 * time.Minute
)

// explainReply is /explain's JSON answer: the explanation's fields, and
// "kernel" beside them (servicelb.ExplanationSchema).
type explainReply struct {
	e      *servicelb.Explanation
	kernel *servicelb.KernelCheck
}

func (r explainReply) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.e)
	if err != nil || r.kernel == nil {
		return b, err
	}
	k, err := json.Marshal(r.kernel)
	if err != nil {
		return nil, err
	}
	// The explanation's object, with "kernel" last.
	b = append(bytes.TrimSuffix(b, []byte("}")), `,"kernel":`...)
	return append(append(b, k...), '}'), nil
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// ParseFlow reads a flow as `kproxy explain` and /explain take it: from,
// an address with or without a port; to, an address and port with or
// without "/protocol" (tcp, udp, sctp; protocol says it otherwise, TCP
// by default); origin, empty (told from the node config), outside, pod or
// node; in, the interface the flow comes in on.
func ParseFlow(from, to, protocol, origin, in string) (servicelb.Flow, error) {
	var f servicelb.Flow
	if from == "" || to == "" {
		return f, errors.New("a flow needs from (an address, a port optional) and to (address:port)")
	}
	if ap, err := netip.ParseAddrPort(from); err == nil {
		f.Src = ap
	} else if a, err := netip.ParseAddr(from); err == nil {
		f.Src = netip.AddrPortFrom(a, 0)
	} else {
		return f, fmt.Errorf("from %q: not an address, or an address and port", from)
	}
	if dst, proto, ok := strings.Cut(to, "/"); ok {
		to, protocol = dst, proto
	}
	dst, err := netip.ParseAddrPort(to)
	if err != nil {
		return f, fmt.Errorf("to %q: not an address and port (such as 10.96.0.10:80/tcp)", to)
	}
	f.Dst = dst
	switch strings.ToLower(protocol) {
	case "", "tcp":
		f.Protocol = servicelb.TCP
	case "udp":
		f.Protocol = servicelb.UDP
	case "sctp":
		f.Protocol = servicelb.SCTP
	default:
		return f, fmt.Errorf("protocol %q: want tcp, udp or sctp", protocol)
	}
	if origin != "" {
		i := slices.IndexFunc(servicelb.Origins(), func(o servicelb.Origin) bool { return o.String() == origin })
		if i < 0 {
			return f, fmt.Errorf("origin %q: want outside, pod or node", origin)
		}
		o := servicelb.Origins()[i]
		f.Origin = &o
	}
	f.InInterface = in
	return f, nil
}
