package healthcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/httpserve"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// ServicesOptions configure Services. The zero value serves every
// address of the caller's namespace and takes the proxy as healthy.
type ServicesOptions struct {
	// NetNS is the network namespace to listen in, the node's; zero or
	// netns.None() means the caller's.
	NetNS netns.NsHandle
	// Addrs are the addresses to listen on, such as the node's node-port
	// addresses; empty means every address of the namespace, of both
	// families.
	Addrs []netip.Addr
	// ProxyHealthy reports whether the proxy keeps the kernel up to date,
	// such as Proxy.Live: a service is healthy only while it does. Nil
	// means it always does.
	ProxyHealthy func() bool
	// MaxConns bounds the connections all the health check node ports
	// hold at once; one beyond it is closed as soon as it is accepted,
	// with a warning. Zero or less means DefaultServicesMaxConns.
	MaxConns int
	// Logger receives the servers opened and closed at Info; nil
	// discards.
	Logger *slog.Logger
}

// DefaultServicesMaxConns is the default of ServicesOptions.MaxConns: a
// load balancer probes a port every few seconds, on one connection or a
// few.
const DefaultServicesMaxConns = 512

// ListenError is a health check node port that could not be opened.
type ListenError struct {
	Service string
	Port    uint16
	Err     error
}

func (e *ListenError) Error() string {
	return fmt.Sprintf("service %q: health check node port %d: %v", e.Service, e.Port, e.Err)
}

func (e *ListenError) Unwrap() error { return e.Err }

// Services serves the health check node port of every service that holds
// one in the states given to Sync. Its methods are safe for concurrent
// use.
type Services struct {
	o     ServicesOptions
	log   *slog.Logger
	conns *httpserve.Conns

	mu      sync.Mutex
	last    *servicelb.State
	servers map[string]*serviceServer
	failed  map[string]bool // services whose port could not be opened
	closed  bool
}

// serviceServer serves one service's health check node port.
type serviceServer struct {
	service string
	port    uint16
	local   atomic.Int64
	healthy func() bool
	http    *httpServer
}

// NewServices returns Services that serve nothing until Sync.
func NewServices(o ServicesOptions) *Services {
	s := &Services{o: o, log: o.Logger, servers: map[string]*serviceServer{}, failed: map[string]bool{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.o.ProxyHealthy == nil {
		s.o.ProxyHealthy = func() bool { return true }
	}
	s.o.Addrs = slices.Clone(o.Addrs)
	s.conns = newConns(o.MaxConns, DefaultServicesMaxConns, "health check node ports", s.log)
	return s
}

// Sync makes the servers match st: see the package documentation. It
// returns a *ListenError for each port it could not open, joined; every
// other service is served, and the next Sync tries those ports again.
func (s *Services) Sync(st *servicelb.State) error {
	if err := st.Check(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	want := map[string]servicelb.HealthCheck{}
	for _, name := range s.touched(st) {
		delete(s.failed, name)
		if hc, ok := st.HealthCheck(name); ok {
			want[name] = hc
		}
		sv := s.servers[name]
		if sv == nil {
			continue
		}
		if hc, ok := want[name]; ok && hc.Port == sv.port {
			sv.local.Store(int64(hc.LocalEndpoints))
			delete(want, name)
			continue
		}
		// Closed before any is opened: a port may pass from one
		// service to another in one state.
		s.stop(sv)
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if err := s.start(want[name]); err != nil {
			s.failed[name] = true
			errs = append(errs, err)
		}
	}
	s.last = st
	return errors.Join(errs...)
}

// touched returns the services whose health check may differ from what
// is served: those st changed since the last Sync (all of them the first
// time), and those whose port could not be opened.
func (s *Services) touched(st *servicelb.State) []string {
	names := map[string]bool{}
	for name := range s.failed {
		names[name] = true
	}
	if s.last == nil {
		for _, hc := range st.HealthChecks() {
			names[hc.Service] = true
		}
	} else {
		ch := servicelb.Diff(s.last, st)
		for _, sp := range ch.Added {
			names[sp.Key.Service] = true
		}
		for _, sp := range ch.Removed {
			names[sp.Key.Service] = true
		}
		for _, c := range ch.Changed {
			names[c.New.Key.Service] = true
		}
	}
	return slices.Sorted(maps.Keys(names))
}

// start opens and serves a service's port.
func (s *Services) start(hc servicelb.HealthCheck) error {
	lns, err := listen(s.o.NetNS, s.o.Addrs, hc.Port)
	if err != nil {
		return &ListenError{Service: hc.Service, Port: hc.Port, Err: err}
	}
	sv := &serviceServer{service: hc.Service, port: hc.Port, healthy: s.o.ProxyHealthy}
	sv.local.Store(int64(hc.LocalEndpoints))
	sv.http = serve(sv, lns, s.conns, s.log)
	s.servers[hc.Service] = sv
	s.log.Info("serving a health check node port", "service", hc.Service, "port", hc.Port, "localEndpoints", hc.LocalEndpoints)
	return nil
}

// stop closes a service's port.
func (s *Services) stop(sv *serviceServer) {
	sv.http.close()
	delete(s.servers, sv.service)
	s.log.Info("closed a health check node port", "service", sv.service, "port", sv.port)
}

// Close closes every port and waits until no goroutine serves them. Later
// Syncs return ErrClosed.
func (s *Services) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, name := range slices.Sorted(maps.Keys(s.servers)) {
		s.stop(s.servers[name])
	}
	return nil
}

// Ports returns the ports served, by service.
func (s *Services) Ports() map[string]uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint16, len(s.servers))
	for name, sv := range s.servers {
		out[name] = sv.port
	}
	return out
}

// serviceStatus is the body of a health check node port's answer.
type serviceStatus struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int64 `json:"localEndpoints"`
	ServiceProxyHealthy bool  `json:"serviceProxyHealthy"`
}

func (sv *serviceServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !httpserve.Readable(w, r) {
		return
	}
	var st serviceStatus
	st.Service.Namespace, st.Service.Name = splitName(sv.service)
	st.LocalEndpoints = sv.local.Load()
	st.ServiceProxyHealthy = sv.healthy()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Load-Balancing-Endpoint-Weight", strconv.FormatInt(st.LocalEndpoints, 10))
	code := http.StatusServiceUnavailable
	if st.LocalEndpoints > 0 && st.ServiceProxyHealthy {
		code = http.StatusOK
	}
	w.WriteHeader(code)
	body, _ := json.MarshalIndent(&st, "", "\t") // cannot fail: strings, a number, a bool
	_, _ = w.Write(body)
}

// splitName splits "namespace/name" at its first slash; a name without one
// has an empty namespace.
func splitName(s string) (namespace, name string) {
	if ns, n, ok := strings.Cut(s, "/"); ok {
		return ns, n
	}
	return "", s
}
