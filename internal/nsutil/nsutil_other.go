//go:build !linux

package nsutil

import "github.com/vishvananda/netns"

// Do runs f when ns is the zero handle (the caller's namespace), and
// returns ErrNotSupported otherwise.
func Do(ns netns.NsHandle, f func() error) error {
	if ns == 0 {
		return f()
	}
	return ErrNotSupported
}

// DoNew returns ErrNotSupported.
func DoNew(func() error) error { return ErrNotSupported }
