//go:build soak

package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// lineIdle is how long the line server keeps a silent connection.
const lineIdle = 30 * time.Second

// serveLines starts the line echo on port of h's IPv4 addresses: it
// greets each connection with the host's name, then echoes every line,
// keeping the connection open. It stops when the test ends.
func serveLines(t *testing.T, h *netnstest.Host, port uint16) {
	t.Helper()
	var ln net.Listener
	err := h.Do(func() (err error) {
		ln, err = new(net.ListenConfig).Listen(context.Background(), "tcp4", fmt.Sprintf(":%d", port))
		return err
	})
	require.NoError(t, err, "%s: listen on %d", h.Name, port)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				echoLines(h.Name, c)
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// echoLines serves one connection of the line echo.
func echoLines(name string, c net.Conn) {
	defer c.Close()
	if _, err := fmt.Fprintf(c, "%s\n", name); err != nil {
		return
	}
	r := bufio.NewReader(c)
	for {
		c.SetDeadline(time.Now().Add(lineIdle))
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(line)); err != nil {
			return
		}
	}
}

// startTraffic starts the askers and the sessions; they run until ctx
// ends.
func (s *soak) startTraffic(ctx context.Context) {
	for i := range *flagAskers {
		rng := rand.New(rand.NewPCG(s.seed, uint64(100+i)))
		every := time.Duration(float64(*flagAskers) / *flagAskRate * float64(time.Second))
		s.traffic.Go(func() { s.askLoop(ctx, rng, every) })
	}
	for i := range *flagSessions {
		rng := rand.New(rand.NewPCG(s.seed, uint64(1000+i)))
		s.traffic.Go(func() { s.sessionLoop(ctx, rng) })
	}
}

// askLoop makes a fresh connection to a random service's port 80 every
// every, until ctx ends.
func (s *soak) askLoop(ctx context.Context, rng *rand.Rand, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		i := rng.IntN(*flagServices)
		start := time.Now()
		_, err := s.tp.Client.Ask(ctx, "tcp", netip.AddrPortFrom(clusterIP(i), httpPort), netnstest.Timeout(askTimeout))
		if ctx.Err() != nil {
			return // the end of the soak, not a failure
		}
		s.led.asked()
		if err != nil {
			s.led.failed(failure{what: whatAsk, start: start, end: time.Now(), svc: i, err: err.Error()})
		}
	}
}

// sessionLoop keeps a session to a random service's port 81, a new one
// after each failure, until ctx ends.
func (s *soak) sessionLoop(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		i := rng.IntN(*flagServices)
		start := time.Now()
		c, host, err := s.dialLine(ctx, i)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.led.failed(failure{what: whatConnect, start: start, end: time.Now(), svc: i, err: err.Error()})
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		s.converse(ctx, c, i, host)
		c.Close()
	}
}

// dialLine connects from the client to service i's port 81 and reads the
// greeting: the name of the backend host that answers.
func (s *soak) dialLine(ctx context.Context, i int) (net.Conn, string, error) {
	var c net.Conn
	d := net.Dialer{Timeout: askTimeout}
	dst := netip.AddrPortFrom(clusterIP(i), linePort).String()
	err := s.tp.Client.Do(func() (err error) {
		c, err = d.DialContext(ctx, "tcp4", dst)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	c.SetDeadline(time.Now().Add(askTimeout))
	greeting, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return nil, "", fmt.Errorf("greeting from %s: %w", dst, err)
	}
	return c, strings.TrimSpace(greeting), nil
}

// converse sends a line a second on c, and expects it back within
// askTimeout, until a failure, which it records, or the end of ctx.
func (s *soak) converse(ctx context.Context, c net.Conn, i int, host string) {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	ep, _ := backendAddr(host)
	r := bufio.NewReader(c)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		start := time.Now()
		err := echo(c, r, strconv.Itoa(n))
		if ctx.Err() != nil {
			return
		}
		s.led.checked()
		if err != nil {
			end := time.Now()
			s.led.failed(failure{
				what: whatSession, start: start, end: end, svc: i, endpoint: host, err: err.Error(),
				removed: s.world.removedWithin(i, ep, end, removedGrace+end.Sub(start)),
			})
			return
		}
	}
}

// echo sends line on c and reads it back within askTimeout.
func echo(c net.Conn, r *bufio.Reader, line string) error {
	c.SetDeadline(time.Now().Add(askTimeout))
	if _, err := fmt.Fprintf(c, "%s\n", line); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	if got = strings.TrimSpace(got); got != line {
		return fmt.Errorf("sent %q, got %q back", line, got)
	}
	return nil
}

// sleep waits for d or the end of ctx.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
