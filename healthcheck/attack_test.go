package healthcheck_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/healthcheck"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// runProxy serves a healthy proxy's health on a free loopback port until
// the test ends, and returns its address.
func runProxy(t *testing.T, o healthcheck.ProxyOptions) string {
	t.Helper()
	o.Addr = fmt.Sprintf("127.0.0.1:%d", freePort())
	o.Health = func() servicelb.Health { return servicelb.Health{Ready: true, AppliedAt: time.Now()} }
	p, err := healthcheck.NewProxy(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", o.Addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	return o.Addr
}

// answers checks that /healthz answers 200 on a new connection, within
// 5 s.
func answers(t *testing.T, addr, msg string) {
	t.Helper()
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := (&http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Get("http://" + addr + "/healthz")
		if assert.NoError(c, err) {
			resp.Body.Close()
			assert.Equal(c, http.StatusOK, resp.StatusCode)
		}
	}, 5*time.Second, 50*time.Millisecond, msg)
}

// heapInUse returns the bytes of heap and stacks in use after a
// collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}

// TestProxyHeaderFlood: 150 clients that each send a header line of a
// million bytes and then wait cost the server less than 10 MB, while they
// wait and after; the health is answered meanwhile.
func TestProxyHeaderFlood(t *testing.T) {
	addr := runProxy(t, healthcheck.ProxyOptions{})
	before := heapInUse()
	line := append([]byte("GET /healthz HTTP/1.1\r\nHost: node\r\nX-Flood: "), bytes.Repeat([]byte("a"), 1_000_000)...)
	var conns []net.Conn
	var wg sync.WaitGroup
	for range 150 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
		wg.Go(func() {
			// The write ends when the server has read it all, or has
			// closed the connection (then with an error).
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write(line)
		})
	}
	wg.Wait()
	// The server answers each 431 and closes it; until it has, the
	// connections beyond its cap are shed.
	answers(t, addr, "the health while the clients wait")
	during := heapInUse() - before
	for _, c := range conns {
		c.Close()
	}
	after := heapInUse() - before
	t.Logf("heap and stacks: %+d KiB while the clients wait, %+d KiB after", during>>10, after>>10)
	assert.Less(t, during, int64(10<<20), "while the clients wait")
	assert.Less(t, after, int64(10<<20), "after the clients left")
}

// TestProxyHeaderTooLarge: a request whose headers pass the limit is
// answered 431 and its connection closed.
func TestProxyHeaderTooLarge(t *testing.T) {
	addr := runProxy(t, healthcheck.ProxyOptions{})
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: node\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 64<<10))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}

// TestProxyConnectionCap: the server holds at most MaxConns connections;
// one beyond is closed at once, with a warning, and the health is
// answered again as soon as a held one goes.
func TestProxyConnectionCap(t *testing.T) {
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	addr := runProxy(t, healthcheck.ProxyOptions{MaxConns: 4, Logger: logger})
	// Each held connection asks once, so that it holds its share before
	// the next is dialled. runProxy's probe of the port holds one until
	// the server has read its end, which a busy machine may delay: a
	// full set that one of them was shed from is dialled again.
	var held []net.Conn
	require.Eventually(t, func() bool {
		for _, c := range held {
			c.Close()
		}
		held = held[:0]
		for range 4 {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			held = append(held, c)
			if _, err := fmt.Fprint(c, "GET /livez HTTP/1.1\r\nHost: node\r\n\r\n"); err != nil {
				return false
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return false
			}
			resp.Body.Close()
		}
		return true
	}, 5*time.Second, 50*time.Millisecond, "four connections held at once")
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	extra, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := extra.Read(make([]byte, 1))
	assert.Zero(t, n)
	assert.Error(t, err, "a connection beyond the cap was kept")
	assert.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	logMu.Lock()
	assert.Contains(t, logs.String(), "maxConns=4")
	logMu.Unlock()

	held[0].Close()
	answers(t, addr, "the health once a held connection went")
}

// TestProxyMethods: only GET and HEAD are answered.
func TestProxyMethods(t *testing.T) {
	addr := runProxy(t, healthcheck.ProxyOptions{})
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		req, err := http.NewRequest(m, "http://"+addr+"/healthz", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, m)
	}
	resp, err := http.Head("http://" + addr + "/livez")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
