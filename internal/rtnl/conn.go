//go:build linux

package rtnl

import (
	"context"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/kproxy-dev/kproxy/internal/nsutil"
)

// Conn is a route netlink socket in one network namespace, whose
// requests go through internal/nl. Its methods are safe for
// concurrent use; they run one at a time.
type Conn struct {
	c *nl.Conn
}

// Open opens a route netlink socket in ns; zero or netns.None() means the
// caller's namespace, and so does a handle of the calling thread's own
// (nsutil.Do enters none then). Another namespace needs CAP_SYS_ADMIN to
// enter.
func Open(ns netns.NsHandle) (*Conn, error) {
	if !ns.IsOpen() {
		ns = 0 // the caller's
	}
	var c *nl.Conn
	err := nsutil.Do(ns, func() (err error) {
		c, err = nl.Open(unix.NETLINK_ROUTE, nl.Options{})
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Conn{c: c}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.c.Close() }

// Stats returns what the Conn sent so far: system calls and requests.
func (c *Conn) Stats() nl.Stats { return c.c.Stats() }

// SyscallConn returns the socket's raw connection, for ioctls that want a
// socket of the namespace (an interface's name by index).
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.c.SyscallConn() }

// send sends a batch of one request and returns the kernel's answer to
// it.
func (c *Conn) send(ctx context.Context, b *nl.Batch) error {
	errs, err := c.c.Send(ctx, b)
	if err != nil {
		return err
	}
	return errs[0]
}
