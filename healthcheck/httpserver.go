package healthcheck

import (
	"log"
	"net"
	"net/http"

	"github.com/kproxy-dev/kproxy/internal/httpserve"
)

// NewHTTPServer returns a server of h for an agent's other endpoints on a
// node, such as its metrics, with the limits this package's own servers
// keep against whoever reaches the port: request headers of at most 8 KiB,
// read within 5 s, the whole request within 10 s, the answer written
// within 10 s, and a keep-alive connection closed after idling 60 s. It
// answers GET and HEAD only, any other method with 405. errorLog, when
// not nil, receives net/http's own errors (a client gone, a header too
// large). Serve it on a LimitListener, so that a flood of connections
// costs a bounded amount of memory and descriptors.
func NewHTTPServer(h http.Handler, errorLog *log.Logger) *http.Server {
	return httpserve.Server(httpserve.ReadOnly(h), errorLog)
}

// LimitListener returns a listener of ln that holds at most n of the
// connections it accepts open at once; one accepted beyond them is closed
// at once, before any answer. onShed, when not nil, is called with the
// count of connections so closed, at most once every 10 s: for a warning.
// It must not block.
func LimitListener(ln net.Listener, n int, onShed func(total uint64)) net.Listener {
	return httpserve.NewConns(n, onShed).Listener(ln)
}
