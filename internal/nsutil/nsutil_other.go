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

// Own reports whether ns stands for the caller's namespace (the zero
// handle or netns.None()); another handle is ErrNotSupported.
func Own(ns netns.NsHandle) (bool, error) {
	if ns == 0 || ns == netns.None() {
		return true, nil
	}
	return false, ErrNotSupported
}

// DoNew returns ErrNotSupported.
func DoNew(func() error) error { return ErrNotSupported }
