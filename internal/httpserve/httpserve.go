// Package httpserve serves a node's small HTTP endpoints (the proxy's
// health, the health check node ports, metrics) to whoever reaches them:
// they listen on every address of the node by default, so a client may be
// hostile. A server of Server reads a request's headers within
// ReadHeaderTimeout and at most MaxHeaderBytes of them, the whole request
// within ReadTimeout, writes its answer within WriteTimeout, and closes a
// keep-alive connection that idles for IdleTimeout. A Conns budget caps
// the connections its listeners hold at once, closing the ones beyond it
// as soon as they are accepted, so that a flood of connections costs a
// bounded amount of memory and descriptors. ReadOnly answers every method
// but GET and HEAD with 405.
//
// Go's net/http applies none of these limits by default but a header
// limit of 1 MB; kube-proxy's servers set none either.
package httpserve

import (
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The limits of a Server. A request to these endpoints is a line and a few
// headers; an answer, a few KiB (metrics: a few hundred KiB).
const (
	MaxHeaderBytes    = 8 << 10
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 10 * time.Second
	WriteTimeout      = 10 * time.Second
	IdleTimeout       = 60 * time.Second
)

// Server returns a server of h with the package's limits. errorLog, when
// not nil, receives net/http's own errors (a client that went away, a
// header too large).
func Server(h http.Handler, errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		ErrorLog:          errorLog,
	}
}

// ReadOnly passes GET and HEAD requests to h and answers any other with
// 405 Method Not Allowed.
func ReadOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if Readable(w, r) {
			h.ServeHTTP(w, r)
		}
	})
}

// Readable reports whether r is a GET or HEAD request; it answers any
// other with 405 Method Not Allowed, for a handler to return.
func Readable(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
	return false
}

// Conns is a budget of connections, shared by the listeners it wraps: at
// most its size are open at once; one accepted beyond it is closed at
// once (its client sees the connection end before any answer).
type Conns struct {
	free     chan struct{}
	shed     atomic.Uint64
	reported atomic.Int64 // Unix nanoseconds of the last OnShed
	onShed   func(total uint64)
}

// ShedReportInterval is how often at most a Conns calls its onShed.
const ShedReportInterval = 10 * time.Second

// NewConns returns a budget of n connections. onShed, when not nil, is
// called with the count of connections shed so far when one is, at most
// once every ShedReportInterval: for a warning. It must not block.
func NewConns(n int, onShed func(total uint64)) *Conns {
	c := &Conns{free: make(chan struct{}, n), onShed: onShed}
	for range n {
		c.free <- struct{}{}
	}
	return c
}

// Size returns the budget's size.
func (c *Conns) Size() int { return cap(c.free) }

// Shed returns how many connections were closed for want of budget.
func (c *Conns) Shed() uint64 { return c.shed.Load() }

func (c *Conns) shedOne() {
	n := c.shed.Add(1)
	if c.onShed == nil {
		return
	}
	now, last := time.Now().UnixNano(), c.reported.Load()
	if (last == 0 || now-last >= int64(ShedReportInterval)) && c.reported.CompareAndSwap(last, now) {
		c.onShed(n)
	}
}

// Listener wraps ln: each connection it accepts takes one of the budget
// until it is closed.
func (c *Conns) Listener(ln net.Listener) net.Listener { return &listener{Listener: ln, c: c} }

type listener struct {
	net.Listener
	c *Conns
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case <-l.c.free:
			return &budgeted{Conn: conn, c: l.c}, nil
		default:
			// Counted and reported before its client can see it end.
			l.c.shedOne()
			_ = conn.Close()
		}
	}
}

// budgeted is a connection that gives its share of the budget back when
// closed, once.
type budgeted struct {
	net.Conn
	c    *Conns
	once sync.Once
}

func (b *budgeted) Close() error {
	err := b.Conn.Close()
	b.once.Do(func() { b.c.free <- struct{}{} })
	return err
}

// CloseWrite ends the connection's sending half, as net/http does before
// closing a connection it answered, so that the client reads the whole
// answer.
func (b *budgeted) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
