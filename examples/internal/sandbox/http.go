package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

type server struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// ServeHTTP starts an HTTP server on the host's address and port that
// answers every request with the host's name and a newline. It stops at
// Close or StopHTTP.
func (h *Host) ServeHTTP(port uint16) error {
	var ln net.Listener
	addr := netip.AddrPortFrom(h.Addr, port).String()
	err := In(h.NS, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return fmt.Errorf("sandbox: %s listen %s: %w", h.Name, addr, err)
	}
	name := h.Name
	s := &server{ln: ln, done: make(chan struct{})}
	s.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, name+"\n")
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	h.mu.Lock()
	h.servers = append(h.servers, s)
	h.mu.Unlock()
	return nil
}

// StopHTTP stops the host's HTTP servers.
func (h *Host) StopHTTP() { h.stopServers() }

func (h *Host) stopServers() {
	h.mu.Lock()
	servers := h.servers
	h.servers = nil
	h.mu.Unlock()
	for _, s := range servers {
		_ = s.srv.Close()
		<-s.done
	}
}

// HTTPClient returns an HTTP client whose connections are made from the
// host's namespace. Every request opens a new connection, so that each one
// is a new flow for the load balancer to place.
func (h *Host) HTTPClient(timeout time.Duration) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := In(h.NS, func() error {
			var err error
			d := net.Dialer{Timeout: timeout}
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true, Proxy: nil},
	}
}

// Get sends one GET request from the client host and returns the body
// without its trailing newline: the name of the backend that answered.
func (sb *Sandbox) Get(ctx context.Context, url string) (string, error) {
	return GetWith(ctx, sb.Client.HTTPClient(2*time.Second), url)
}

// GetWith sends one GET request with c and returns the body without its
// trailing newline; a status other than 200 is an error.
func GetWith(ctx context.Context, c *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return strings.TrimSpace(string(body)), nil
}

// Counts is how many requests each backend answered; failed requests are
// counted under the key "error".
type Counts map[string]int

// DefaultRequestTimeout bounds each request Distribute sends, unless
// Options.RequestTimeout says otherwise. Every server is a hop away, so an
// answer takes well under a millisecond; a request that gets none is
// counted as an error after this long. TCP treats an ICMP unreachable (an
// address nothing routes) as a soft error and waits out the timeout, so it
// is short.
const DefaultRequestTimeout = 200 * time.Millisecond

// Distribute sends n requests from the client host, one connection each,
// and counts who answered. Failures are counted, not returned. When ctx
// ends it returns the counts so far with ctx's error.
func (sb *Sandbox) Distribute(ctx context.Context, url string, n int) (Counts, error) {
	c := sb.Client.HTTPClient(sb.timeout)
	out := Counts{}
	for range n {
		name, err := GetWith(ctx, c, url)
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		if err != nil {
			name = "error"
		}
		out[name]++
	}
	return out, nil
}

// Eventually sends requests from the client host until check accepts the
// counts of a batch of n, or ctx ends; it returns the last counts. It is how
// tests wait for rules to take effect without sleeping blindly.
func (sb *Sandbox) Eventually(ctx context.Context, url string, n int, check func(Counts) bool) (Counts, error) {
	var last Counts
	for {
		c, err := sb.Distribute(ctx, url, n)
		if len(c) > 0 {
			// A batch cut short by ctx still counts: requests that fail
			// take the request timeout each.
			last = c
			if check(c) {
				return c, nil
			}
		}
		if err != nil {
			return last, fmt.Errorf("sandbox: %s: last counts %v: %w", url, last, err)
		}
		select {
		case <-ctx.Done():
			return last, errors.Join(fmt.Errorf("sandbox: %s: last counts %v", url, last), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
