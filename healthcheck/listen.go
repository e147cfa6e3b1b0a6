package healthcheck

import (
	"errors"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/httpserve"
	"github.com/kproxy-dev/kproxy/internal/nsutil"
)

// ErrClosed: a Sync after Close.
var ErrClosed = errors.New("healthcheck: closed")

// listen opens a TCP listener on port at each address in the namespace
// ns, or one on every address of both families when there are none. On
// error it closes what it opened.
func listen(ns netns.NsHandle, addrs []netip.Addr, port uint16) ([]net.Listener, error) {
	hosts := []string{""}
	if len(addrs) > 0 {
		hosts = hosts[:0]
		for _, a := range addrs {
			hosts = append(hosts, a.String())
		}
	}
	var out []net.Listener
	err := inNS(ns, func() error {
		for _, h := range hosts {
			ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(int(port))))
			if err != nil {
				return err
			}
			out = append(out, ln)
		}
		return nil
	})
	if err != nil {
		for _, ln := range out {
			_ = ln.Close()
		}
		return nil, err
	}
	return out, nil
}

// inNS runs f in the namespace ns; zero and netns.None() are the caller's.
func inNS(ns netns.NsHandle, f func() error) error {
	if ns == netns.None() {
		ns = 0
	}
	return nsutil.Do(ns, f)
}

// httpServer is an HTTP server on listeners, with the goroutines that
// serve them.
type httpServer struct {
	srv *http.Server
	lns []net.Listener
	wg  sync.WaitGroup
	// failed receives the error of a listener that failed.
	failed chan error
}

// serve starts serving h on lns, with package httpserve's limits, the
// connections counted against conns.
func serve(h http.Handler, lns []net.Listener, conns *httpserve.Conns, logger *slog.Logger) *httpServer {
	s := &httpServer{lns: lns, srv: httpserve.Server(h, log.New(slogWriter{logger}, "", 0)), failed: make(chan error, len(lns))}
	for _, ln := range lns {
		s.wg.Go(func() {
			if err := s.srv.Serve(conns.Listener(ln)); !errors.Is(err, http.ErrServerClosed) {
				s.failed <- err
			}
		})
	}
	return s
}

// newConns returns a budget of n connections (def when n is not
// positive) that warns on logger when it sheds one.
func newConns(n, def int, server string, logger *slog.Logger) *httpserve.Conns {
	if n <= 0 {
		n = def
	}
	return httpserve.NewConns(n, func(shed uint64) {
		logger.Warn("closing new connections at once: the server holds its most", "server", server, "maxConns", n, "shed", shed)
	})
}

// close closes the listeners and the connections, and waits until no
// goroutine serves them any more. The ports are free when it returns.
func (s *httpServer) close() {
	_ = s.srv.Close()
	for _, ln := range s.lns {
		_ = ln.Close()
	}
	s.wg.Wait()
}

// slogWriter hands net/http's error log lines to a logger at Debug: a
// client that goes away mid-request is no news.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(b []byte) (int, error) {
	w.log.Debug(string(trimNewline(b)))
	return len(b), nil
}

func trimNewline(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == '\n' {
		b = b[:len(b)-1]
	}
	return b
}
