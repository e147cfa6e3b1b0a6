package httpserve

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServerLimits: a server bounds what a client may make it hold: the
// headers' size, the time to send them and the request, to take the
// answer, and to idle between requests.
func TestServerLimits(t *testing.T) {
	s := Server(http.NotFoundHandler(), nil)
	assert.Equal(t, 8<<10, s.MaxHeaderBytes)
	for name, d := range map[string]time.Duration{
		"ReadHeaderTimeout": s.ReadHeaderTimeout, "ReadTimeout": s.ReadTimeout,
		"WriteTimeout": s.WriteTimeout, "IdleTimeout": s.IdleTimeout,
	} {
		assert.Positive(t, d, name)
		assert.LessOrEqual(t, d, time.Minute, name)
	}
}

// TestReadOnly: GET and HEAD reach the handler; any other method is
// answered 405 with the methods allowed.
func TestReadOnly(t *testing.T) {
	h := ReadOnly(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	for _, m := range []string{http.MethodGet, http.MethodHead} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(m, "/healthz", nil))
		assert.Equal(t, http.StatusOK, w.Code, m)
	}
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(m, "/healthz", nil))
		assert.Equal(t, http.StatusMethodNotAllowed, w.Code, m)
		assert.Equal(t, "GET, HEAD", w.Header().Get("Allow"), m)
		assert.NotContains(t, w.Body.String(), "ok", m)
	}
}

// TestConnsBudget: the listeners of one budget hold at most its size of
// connections together; one beyond is closed as soon as it is accepted
// and reported; a closed connection gives its share back.
func TestConnsBudget(t *testing.T) {
	var reports atomic.Int32
	c := NewConns(2, func(uint64) { reports.Add(1) })
	accepted := make(chan net.Conn, 8)
	var addrs []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		addrs = append(addrs, ln.Addr().String())
		bl := c.Listener(ln)
		go func() {
			for {
				conn, err := bl.Accept()
				if err != nil {
					return
				}
				accepted <- conn
			}
		}()
	}
	dial := func(addr string) net.Conn {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	// closedAtOnce reports whether the server closed conn without a word.
	closedAtOnce := func(conn net.Conn) bool {
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := conn.Read(make([]byte, 1))
		return err == io.EOF
	}
	dial(addrs[0])
	dial(addrs[1])
	held := []net.Conn{<-accepted, <-accepted}
	for i := range 3 {
		assert.True(t, closedAtOnce(dial(addrs[i%2])), "connection %d beyond the budget", i)
	}
	assert.Equal(t, uint64(3), c.Shed())
	assert.Equal(t, int32(1), reports.Load(), "shedding is reported at most once an interval")
	assert.Empty(t, accepted)

	require.NoError(t, held[0].Close())
	_ = held[0].Close() // gives nothing back a second time
	dial(addrs[1])
	<-accepted
	assert.True(t, closedAtOnce(dial(addrs[0])), "the budget grew")
	assert.Equal(t, uint64(4), c.Shed())
}
