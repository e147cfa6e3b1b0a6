package healthcheck_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/healthcheck"
)

// TestNewHTTPServer: an agent's other endpoints get the limits of the
// package's own servers: GET and HEAD only, 8 KiB of headers, and a cap on
// the connections held at once, beyond which a new one is closed before
// any answer and counted.
func TestNewHTTPServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var shed atomic.Uint64
	srv := healthcheck.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "metrics\n")
	}), nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(healthcheck.LimitListener(ln, 2, func(total uint64) { shed.Store(total) }))
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	url := "http://" + ln.Addr().String() + "/metrics"
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

	resp, err := client.Get(url)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "metrics\n", string(body))

	resp, err = client.Post(url, "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))

	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("X-Big", strings.Repeat("a", 16<<10))
	resp, err = client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)

	// Two idle connections hold the budget; a third is closed unanswered.
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
	}
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return false
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 1))
		return err == io.EOF
	}, 5*time.Second, 50*time.Millisecond)
	assert.Equal(t, uint64(1), shed.Load())
}
