//go:build linux

package rtnl

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/kproxy-dev/kproxy/internal/nsutil"
)

// AddrEvents is a route netlink socket of one namespace that receives the
// kernel's notifications of addresses added and deleted, IPv4 and IPv6
// (the RTMGRP_IPV4_IFADDR and RTMGRP_IPV6_IFADDR groups). It says that
// something changed, not what: a follower lists the addresses again.
type AddrEvents struct{ s *nl.Socket }

// WatchAddrs subscribes to the address notifications of ns (zero or
// netns.None(): the caller's namespace). Subscribe before listing, so
// that no change falls between the list and the first notification.
func WatchAddrs(ns netns.NsHandle) (*AddrEvents, error) {
	if !ns.IsOpen() {
		ns = 0
	}
	var s *nl.Socket
	err := nsutil.Do(ns, func() (err error) {
		s, err = nl.OpenSocket(unix.NETLINK_ROUTE, nl.Options{
			Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to address notifications: %w", err)
	}
	return &AddrEvents{s: s}, nil
}

// Next waits for the next notification of an address change and returns
// nil when it comes, or when the kernel dropped notifications that did
// not fit the socket's buffer (a burst: list again all the same); else
// ctx's error, or the socket's.
func (e *AddrEvents) Next(ctx context.Context) error {
	for {
		msgs, err := e.s.Read(ctx)
		if errors.Is(err, nl.ErrLost) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Type == unix.RTM_NEWADDR || m.Type == unix.RTM_DELADDR {
				return nil
			}
		}
	}
}

// Close closes the socket.
func (e *AddrEvents) Close() error { return e.s.Close() }
