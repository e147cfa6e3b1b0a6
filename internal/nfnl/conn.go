//go:build linux

package nfnl

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// Options configure a Conn.
type Options struct {
	// NetNS is a file descriptor of the network namespace to talk to, such
	// as a github.com/vishvananda/netns.NsHandle; zero or negative means
	// the caller's namespace. The socket is created in that namespace and
	// stays bound to it: the descriptor may be closed once Open returns.
	NetNS int
	// ReceiveBuffer is the socket's receive buffer for dumps, in bytes;
	// zero means 8 MiB.
	ReceiveBuffer int
}

// Conn is a netlink socket of the nf_tables subsystem in one network
// namespace. Its methods are safe for concurrent use; they run one at a
// time.
type Conn struct {
	mu      sync.Mutex
	s       *nl.Socket
	closed  bool
	scratch encoder
	refuse  func(owner any) bool // RefuseRules
}

// Open opens a Conn. It needs CAP_NET_ADMIN in the target namespace to
// change or read the ruleset.
func Open(o Options) (*Conn, error) {
	s, err := nl.OpenSocket(unix.NETLINK_NETFILTER, nl.Options{
		NetNS:         o.NetNS,
		ReceiveBuffer: o.ReceiveBuffer,
		ReadBuffer:    1 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("nfnl: %w", err)
	}
	return &Conn{s: s}, nil
}

// Close closes the socket.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.s.Close()
}

// errorOf decodes an NLMSG_ERROR message: its errno (0 for an
// acknowledgement), the kernel's explanation, and the offset in the
// failed message of the attribute it refused (0 for none).
func errorOf(m nl.Message) (errno syscall.Errno, text string, attr int) {
	var e *nl.Error
	if !errors.As(nl.ParseAck(m), &e) {
		return 0, "", 0
	}
	return e.Errno, e.Text, e.Offset
}
