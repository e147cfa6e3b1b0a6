package healthcheck

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/httpserve"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// DefaultAddr is where kube-proxy serves its health by default.
const DefaultAddr = "0.0.0.0:10256"

// DefaultTimeout returns the bound on the wait of a change for a Runner
// whose MaxSyncInterval is maxSyncInterval (zero: its default): twice it,
// as kube-proxy allows twice its sync period. See the package
// documentation.
func DefaultTimeout(maxSyncInterval time.Duration) time.Duration {
	return 2 * cmp.Or(maxSyncInterval, servicelb.DefaultMaxSyncInterval)
}

// ProxyOptions configure a Proxy.
type ProxyOptions struct {
	// Health reports the proxy's state, such as Runner.Health. Required.
	Health func() servicelb.Health
	// Addr is where Run listens, host:port; default DefaultAddr.
	Addr string
	// NetNS is the network namespace Run listens in; zero or netns.None()
	// means the caller's.
	NetNS netns.NsHandle
	// Timeout is how long a change may wait to be applied before the
	// proxy is no longer live; zero means DefaultTimeout(0).
	Timeout time.Duration
	// NodeEligible reports whether the node may take traffic; nil means
	// it always may. kube-proxy's node is not eligible once it is being
	// deleted or is tainted ToBeDeletedByClusterAutoscaler.
	NodeEligible func() bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Answered, when set, is told about every answer to /healthz and
	// /livez with its status code, for metrics (kube-proxy's
	// proxy_healthz_total and proxy_livez_total). It must not block.
	Answered func(path string, code int)
	// MaxConns bounds the connections Run's server holds at once; one
	// beyond it is closed as soon as it is accepted, with a warning. Zero
	// means DefaultProxyMaxConns.
	MaxConns int
	// Logger receives the server's start at Info; nil discards.
	Logger *slog.Logger
}

// DefaultProxyMaxConns is the default of ProxyOptions.MaxConns.
const DefaultProxyMaxConns = 128

// Proxy serves a proxy's /healthz and /livez: see the package
// documentation. It is an http.Handler, to mount on a server of one's
// own, and serves on ProxyOptions.Addr with Run.
type Proxy struct {
	o   ProxyOptions
	log *slog.Logger
}

// NewProxy checks the options and returns a Proxy.
func NewProxy(o ProxyOptions) (*Proxy, error) {
	if o.Health == nil {
		return nil, errors.New("healthcheck: ProxyOptions.Health is required")
	}
	if o.Timeout < 0 {
		return nil, fmt.Errorf("healthcheck: negative timeout %s", o.Timeout)
	}
	if o.MaxConns < 0 {
		return nil, fmt.Errorf("healthcheck: negative MaxConns %d", o.MaxConns)
	}
	o.Addr = cmp.Or(o.Addr, DefaultAddr)
	o.Timeout = cmp.Or(o.Timeout, DefaultTimeout(0))
	if o.Now == nil {
		o.Now = time.Now
	}
	p := &Proxy{o: o, log: o.Logger}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	return p, nil
}

// Live reports whether no change has waited Timeout or longer to be
// applied: what /livez and a health check node port's
// serviceProxyHealthy say.
func (p *Proxy) Live() bool {
	return !p.o.Health().Stalled(p.o.Now(), p.o.Timeout)
}

// Healthy reports what /healthz says: the first sync is done, the proxy
// is live, and the node is eligible.
func (p *Proxy) Healthy() bool {
	return p.o.Health().Healthy(p.o.Now(), p.o.Timeout) && p.eligible()
}

func (p *Proxy) eligible() bool { return p.o.NodeEligible == nil || p.o.NodeEligible() }

// proxyStatus is the body of /healthz and /livez.
type proxyStatus struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
	Healthy      bool      `json:"healthy"`
	// Status is the health of each address family, by its name.
	Status map[string]familyStatus `json:"status,omitempty"`
}

// familyStatus is the health of one address family.
type familyStatus struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// familyStatus returns the health of each family of h, or nil.
func (p *Proxy) familyStatus(h servicelb.Health, now time.Time) map[string]familyStatus {
	if len(h.Families) == 0 {
		return nil
	}
	out := make(map[string]familyStatus, len(h.Families))
	for _, f := range h.Families {
		out[f.Family.Name()] = familyStatus{LastUpdated: h.AppliedAt, Healthy: !f.Stalled(now, p.o.Timeout)}
	}
	return out
}

// ServeHTTP answers /healthz and /livez; other paths are not found, and
// methods other than GET and HEAD not allowed.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !httpserve.Readable(w, r) {
		return
	}
	h, now := p.o.Health(), p.o.Now()
	var st proxyStatus
	var ok bool
	switch r.URL.Path {
	case "/healthz":
		eligible := p.eligible()
		st.Healthy, st.NodeEligible = h.Healthy(now, p.o.Timeout), &eligible
		ok = st.Healthy && eligible
	case "/livez":
		st.Healthy = !h.Stalled(now, p.o.Timeout)
		ok = st.Healthy
	default:
		http.NotFound(w, r)
		return
	}
	st.CurrentTime, st.LastUpdated = now, h.AppliedAt
	if ok {
		st.LastUpdated = now
	}
	st.Status = p.familyStatus(h, now)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	code := http.StatusServiceUnavailable
	if ok {
		code = http.StatusOK
	}
	w.WriteHeader(code)
	body, _ := json.Marshal(&st) // cannot fail: times, bools and strings
	_, _ = w.Write(body)
	if p.o.Answered != nil {
		p.o.Answered(r.URL.Path, code)
	}
}

// Run listens on Addr in NetNS and serves until ctx ends, then closes the
// listener and its connections and returns nil; or returns the error that
// kept it from listening or serving.
func (p *Proxy) Run(ctx context.Context) error {
	var ln net.Listener
	err := inNS(p.o.NetNS, func() error {
		var err error
		ln, err = net.Listen("tcp", p.o.Addr)
		return err
	})
	if err != nil {
		return fmt.Errorf("healthcheck: proxy health server: %w", err)
	}
	p.log.Info("serving the proxy's health", "addr", ln.Addr().String())
	s := serve(p, []net.Listener{ln}, newConns(p.o.MaxConns, DefaultProxyMaxConns, "proxy health", p.log), p.log)
	defer s.close()
	select {
	case <-ctx.Done():
		return nil
	case err := <-s.failed:
		return fmt.Errorf("healthcheck: proxy health server: %w", err)
	}
}
