//go:build linux

package userspace

import (
	"bufio"
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestFloodLeavesOtherServices: 1,500 idle connections held to one
// service take at most its share of the flows (MaxPortFlows); the rest
// are shed at once, counted and warned of, and another service answers
// every TCP connection and UDP client meanwhile.
func TestFloodLeavesOtherServices(t *testing.T) {
	w := newWorld(t, 2)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	// The budget of a process limited to 1,024 descriptors.
	p := newProxier(t, w, Options{MaxFlows: 128, MaxPortFlows: 64, Logger: log})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0)), service(2, ep(1))))
	flooded := w.at(key(1, "tcp")).String()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 1500 {
		// A shed connection may be reset before its dial returns.
		if c, err := net.Dial("tcp", flooded); err == nil {
			held = append(held, c)
		}
	}
	require.Eventually(t, func() bool {
		s := stats(t, p, key(1, "tcp"))
		return s.Active == 64 && s.Shed == 1500-64
	}, 10*time.Second, 20*time.Millisecond, "the flood's connections held and shed: %+v", stats(t, p, key(1, "tcp")))
	answered := 0
	for range 20 {
		if name, err := tryTCP(w.at(key(2, "tcp"))); err == nil && name == "ep-1" {
			answered++
		}
		if name, _ := sendUDP(t, udpClient(t), w.at(key(2, "udp")), "x"); name == "ep-1" {
			answered++
		}
	}
	assert.Equal(t, 40, answered, "the other service's TCP and UDP answers")
	mu.Lock()
	assert.Contains(t, logs.String(), "shedding new flows")
	mu.Unlock()
	assert.Zero(t, stats(t, p, key(1, "tcp")).DialErrors, "shed connections were counted as the endpoint's failures")
}

// TestFlowBudgetShared: the proxy's bound holds over all its ports, and
// a flow that ends gives its share back.
func TestFlowBudgetShared(t *testing.T) {
	w := newWorld(t, 2)
	p := newProxier(t, w, Options{MaxFlows: 2, MaxPortFlows: 2})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0)), service(2, ep(1))))
	a, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
	require.NoError(t, err)
	defer a.Close()
	_, err = bufio.NewReader(a).ReadString('\n')
	require.NoError(t, err)
	c := udpClient(t)
	name, _ := sendUDP(t, c, w.at(key(2, "udp")), "x")
	require.Equal(t, "ep-1", name)
	_, err = tryTCP(w.at(key(2, "tcp")))
	assert.Error(t, err, "a third flow was admitted")
	assert.Equal(t, uint64(1), stats(t, p, key(2, "tcp")).Shed)
	a.Close()
	assert.Eventually(t, func() bool {
		name, err := tryTCP(w.at(key(2, "tcp")))
		return err == nil && name == "ep-1"
	}, 5*time.Second, 20*time.Millisecond, "a closed connection gave no share back")
}

// TestLocalErrors: the node's want of descriptors or memory is told from
// an endpoint's failure.
func TestLocalErrors(t *testing.T) {
	for _, err := range []error{unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM, os.NewSyscallError("socket", unix.EMFILE)} {
		assert.True(t, localError(err), "%v", err)
	}
	for _, err := range []error{unix.ECONNREFUSED, unix.ETIMEDOUT, unix.EHOSTUNREACH, errors.New("x"), syscall.ECONNRESET} {
		assert.False(t, localError(err), "%v", err)
	}
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
