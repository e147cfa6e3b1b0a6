//go:build privileged || vm

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
)

// The load a backend switch is measured under: connections a client
// holds open through it, and new ones it opens each second.
const (
	switchHeld = 300
	switchRate = 50
)

// TestSwitchUnderLoad switches the backend of a node while a client
// outside it holds switchHeld keep-alive connections to a cluster IP and
// opens switchRate new ones a second, from before the new backend's
// process starts until a second after its first sync, and counts the
// held connections the switch cut (a request on them fails afterwards)
// and the new ones that failed. kproxy installs the new backend's
// objects before it removes the old one's, and the kernel's flows keep
// their translations whatever the rules, so every switch between
// backends of the kernel loses none. The README gives these figures.
func TestSwitchUnderLoad(t *testing.T) {
	sb := newSandbox(t)
	e := newBPFEnv(t)
	const url = "http://10.96.0.11:80/"
	pairs := [][2]string{{"nftables", "iptables"}, {"iptables", "nftables"}, {"nftables", "ebpf"}, {"ebpf", "nftables"}}
	for _, b := range vmBackends {
		pairs = append(pairs, [2]string{"nftables", b}, [2]string{b, "nftables"})
	}
	once := func(t *testing.T, b string) {
		t.Helper()
		args := []string{"--source", "file", "--file", servicesFile(t), "--backend", b, "--once",
			"--netns", sb.Node.NSName, "--node-name", "node", "--node-ips", sandbox.NodeAddr.String(),
			"--healthz-bind-address=", "--health-check-node-ports=false"}
		code, _, logs := run(t, append(args, e.args()...)...)
		require.Equal(t, 0, code, logs)
	}
	for _, pr := range pairs {
		t.Run(pr[0]+"-to-"+pr[1], func(t *testing.T) {
			once(t, pr[0])
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err := sb.Eventually(ctx, url, 3, func(c sandbox.Counts) bool { return c["error"] == 0 })
			cancel()
			require.NoError(t, err, "%s serves", pr[0])
			l := startLoad(t, sb.Client, "10.96.0.11:80", url)
			start := time.Now()
			once(t, pr[1])
			took := time.Since(start)
			time.Sleep(time.Second)
			r := l.stop(true)
			t.Logf("%s to %s (its process ran %v): %d of %d held connections cut, %d of %d new connections failed; the slowest took %v, at %v",
				pr[0], pr[1], took.Round(time.Millisecond), r.cut, switchHeld, r.failed, r.opened, r.slowest.Round(time.Millisecond), r.slowestAt.Round(time.Millisecond))
			assert.Zero(t, r.cut, "held connections cut")
			assert.Zero(t, r.failed, "new connections failed: %q", r.errs)
		})
	}
	// The load sees a loss: a node whose rules go fails new connections.
	t.Run("cleanup", func(t *testing.T) {
		once(t, "nftables")
		l := startLoad(t, sb.Client, "10.96.0.11:80", url)
		code, _, logs := run(t, append([]string{"--cleanup", "--netns", sb.Node.NSName}, e.args()...)...)
		require.Equal(t, 0, code, logs)
		time.Sleep(time.Second)
		r := l.stop(false)
		t.Logf("cleanup: %d of %d new connections failed", r.failed, r.opened)
		assert.Positive(t, r.failed, "new connections to a service nothing serves any more")
	})
}

// load is the switch's workload: held connections, and new ones.
type load struct {
	held    []*heldConn
	stopped chan struct{}
	wg      sync.WaitGroup
	opened  atomic.Int64
	failed  atomic.Int64
	start   time.Time
	// errs are the first new connections' failures, each with when its
	// connection started; slowest is the slowest that succeeded, and
	// slowestAt when it started.
	mu                 sync.Mutex
	errs               []string
	slowest, slowestAt time.Duration
}

// fail counts a new connection that failed, started at.
func (l *load) fail(at time.Time, err error) {
	l.failed.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < 10 {
		l.errs = append(l.errs, fmt.Sprintf("at %v, after %v: %v", at.Sub(l.start).Round(time.Millisecond), time.Since(at).Round(time.Millisecond), err))
	}
}

// heldConn is a keep-alive HTTP connection that answered once.
type heldConn struct {
	c net.Conn
	r *bufio.Reader
}

// ask sends one request on the connection and reads its answer.
func (h *heldConn) ask() error {
	_ = h.c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(h.c, "GET / HTTP/1.1\r\nHost: service\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(h.r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", resp.Status)
	}
	return err
}

// startLoad opens switchHeld connections from client to addr, each
// answered once, then opens switchRate new ones a second to url until
// stop.
func startLoad(t *testing.T, client *sandbox.Host, addr, url string) *load {
	t.Helper()
	l := &load{stopped: make(chan struct{})}
	t.Cleanup(func() {
		for _, h := range l.held {
			h.c.Close()
		}
	})
	for range switchHeld {
		var c net.Conn
		require.NoError(t, sandbox.In(client.NS, func() (err error) {
			c, err = net.DialTimeout("tcp", addr, 2*time.Second)
			return err
		}))
		h := &heldConn{c: c, r: bufio.NewReader(c)}
		l.held = append(l.held, h)
		require.NoError(t, h.ask(), "a held connection's first request")
	}
	hc := client.HTTPClient(2 * time.Second)
	l.start = time.Now()
	l.wg.Go(func() {
		tick := time.NewTicker(time.Second / switchRate)
		defer tick.Stop()
		for {
			select {
			case <-l.stopped:
				return
			case <-tick.C:
			}
			l.opened.Add(1)
			l.wg.Go(func() {
				at := time.Now()
				if _, err := sandbox.GetWith(context.Background(), hc, url); err != nil {
					l.fail(at, err)
					return
				}
				l.mu.Lock()
				defer l.mu.Unlock()
				if took := time.Since(at); took > l.slowest {
					l.slowest, l.slowestAt = took, at.Sub(l.start)
				}
			})
		}
	})
	return l
}

// loadResult is what a switch did to the load.
type loadResult struct {
	cut, failed, opened int
	// errs are the first failures of new connections, with when each
	// started from the load's start.
	errs []string
	// slowest is the slowest new connection that succeeded, at when it
	// started.
	slowest, slowestAt time.Duration
}

// stop ends the new connections, asks each held one once more (with
// held), and counts.
func (l *load) stop(held bool) loadResult {
	close(l.stopped)
	l.wg.Wait()
	var r loadResult
	for _, h := range l.held {
		if held && h.ask() != nil {
			r.cut++
		}
	}
	r.failed, r.opened = int(l.failed.Load()), int(l.opened.Load())
	l.mu.Lock()
	r.errs, r.slowest, r.slowestAt = l.errs, l.slowest, l.slowestAt
	l.mu.Unlock()
	return r
}

// TestUserspaceHandover restarts kproxy's userspace backend the way an
// upgrade does with --userspace-handover-socket: a second process starts
// beside the first, takes its listening sockets and connections, and the
// first exits by itself. The client's switchHeld held connections and
// the switchRate new ones a second meanwhile go on unharmed.
func TestUserspaceHandover(t *testing.T) {
	sb := newSandbox(t)
	const url = "http://10.96.0.11:80/"
	socket := filepath.Join(t.TempDir(), "handover.sock")
	args := []string{"--metrics-bind-address=", "--bpf-pin-path=", "--source", "file", "--file", servicesFile(t),
		"--backend", "userspace", "--userspace-handover-socket", socket,
		// The load's connections, whatever the descriptors of the test's
		// process (4,096 in the VM) would give by default.
		"--userspace-max-flows", "2000", "--userspace-max-port-flows", "1000",
		"--netns", sb.Node.NSName, "--node-name", "node", "--node-ips", sandbox.NodeAddr.String(),
		"--healthz-bind-address=", "--health-check-node-ports=false", "--log-level", "debug"}
	start := func(name string) (context.CancelFunc, <-chan int, *lockedBuffer) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		code, done := make(chan int, 1), make(chan struct{})
		logs := &lockedBuffer{}
		go func() {
			defer close(done)
			code <- program().Run(ctx, args, io.Discard, logs)
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not stop", name)
			}
		})
		return cancel, code, logs
	}
	_, oldCode, oldLogs := start("the first kproxy")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	_, err := sb.Eventually(ctx, url, 3, func(c sandbox.Counts) bool { return c["error"] == 0 })
	cancel()
	require.NoError(t, err, "the first kproxy serves\n%s", oldLogs)
	l := startLoad(t, sb.Client, "10.96.0.11:80", url)
	_, _, newLogs := start("the second kproxy")
	select {
	case code := <-oldCode:
		require.Equal(t, 0, code, oldLogs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the first kproxy did not hand over and exit\n%s\nthe second's logs:\n%s", oldLogs, newLogs)
	}
	time.Sleep(time.Second)
	r := l.stop(true)
	t.Logf("handover: %d of %d held connections cut, %d of %d new connections failed; the slowest took %v, at %v",
		r.cut, switchHeld, r.failed, r.opened, r.slowest.Round(time.Millisecond), r.slowestAt.Round(time.Millisecond))
	if !assert.Zero(t, r.cut, "held connections cut") || !assert.Zero(t, r.failed, "new connections failed: %q", r.errs) {
		t.Logf("the first kproxy's logs:\n%s\nthe second's:\n%s", oldLogs, newLogs)
	}
	assert.Contains(t, oldLogs.String(), "handed over to a newer kproxy")
	assert.Contains(t, newLogs.String(), "took over")
}

// lockedBuffer is a buffer for a process's logs, read while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
