//go:build linux

package netnstest

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"
)

// SCTP has no support in package net: the echo server uses one-to-one
// (SOCK_STREAM) SCTP sockets made with x/sys/unix (see stream.go).

// listenSCTP opens a listening SCTP socket on every address of one family.
func listenSCTP(v6 bool, port uint16) (*os.File, error) {
	fd, err := streamSocket("sctp", v6)
	if err != nil {
		return nil, err
	}
	wild := netip.AddrPortFrom(netip.IPv4Unspecified(), port)
	if v6 {
		wild = netip.AddrPortFrom(netip.IPv6Unspecified(), port)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sctp SO_REUSEADDR: %w", err)
	}
	if err := unix.Bind(fd, sockaddr.From(wild)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sctp bind %s: %w", wild, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sctp listen %s: %w", wild, err)
	}
	return os.NewFile(uintptr(fd), "sctp-listener"), nil
}

func (h *Host) serveSCTP(s *Server, port uint16) error {
	for _, v6 := range []bool{false, true} {
		var ln *os.File
		err := h.Do(func() (err error) {
			ln, err = listenSCTP(v6, port)
			return err
		})
		if err != nil {
			return err
		}
		s.closers = append(s.closers, ln)
		s.wg.Go(func() { h.acceptSCTP(s, ln, port) })
	}
	return nil
}

func (h *Host) acceptSCTP(s *Server, ln *os.File, port uint16) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return
	}
	for {
		nfd, aerr := -1, error(nil)
		err := rc.Read(func(fd uintptr) bool {
			nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			return !errors.Is(aerr, unix.EAGAIN)
		})
		if err != nil {
			return // the listener was closed
		}
		if aerr != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		c := os.NewFile(uintptr(nfd), "sctp")
		s.wg.Go(func() { h.answerSCTP(c, port) })
	}
}

func (h *Host) answerSCTP(c *os.File, port uint16) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(connTimeout))
	buf := make([]byte, 512)
	if _, err := c.Read(buf); err != nil && err != io.EOF {
		return
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	var peer unix.Sockaddr
	rc.Control(func(fd uintptr) { peer, err = unix.Getpeername(int(fd)) })
	if err != nil {
		return
	}
	c.Write(h.reply(sockaddr.To(peer), port))
}
