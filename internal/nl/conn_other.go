//go:build !linux

package nl

import (
	"context"
	"errors"
	"fmt"
)

// Conn is a netlink socket. Netlink is Linux's: elsewhere Open fails, and
// the packages that speak it build, and report that they cannot.
type Conn struct{}

// Open fails with an error wrapping errors.ErrUnsupported.
func Open(proto int, o Options) (*Conn, error) {
	return nil, fmt.Errorf("open netlink socket: %w", errors.ErrUnsupported)
}

// Close does nothing.
func (c *Conn) Close() error { return nil }

// Stats returns nothing sent.
func (c *Conn) Stats() Stats { return Stats{} }

// Send fails with ErrClosed.
func (c *Conn) Send(ctx context.Context, b *Batch) ([]error, error) {
	return fill(make([]error, b.Len()), 0, ErrUnknown), ErrClosed
}

// Dump fails with ErrClosed.
func (c *Conn) Dump(ctx context.Context, b *Batch, f func(typ uint16, data []byte) error) error {
	return ErrClosed
}

// Get fails with ErrClosed.
func (c *Conn) Get(ctx context.Context, b *Batch, f func(typ uint16, data []byte) error) error {
	return ErrClosed
}
