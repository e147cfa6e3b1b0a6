//go:build linux

package netnstest

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// ICMPError is an ICMP (or ICMPv6) error message about an ask.
type ICMPError struct {
	V6         bool
	Type, Code uint8
}

// PortUnreachable reports whether the error is a destination (port)
// unreachable, port unreachable: ICMP type 3 code 3, ICMPv6 type 1 code 4.
func (e *ICMPError) PortUnreachable() bool {
	if e.V6 {
		return e.Type == 1 && e.Code == 4
	}
	return e.Type == 3 && e.Code == 3
}

func (e *ICMPError) String() string {
	if e.V6 {
		return fmt.Sprintf("icmpv6 type %d code %d", e.Type, e.Code)
	}
	return fmt.Sprintf("icmp type %d code %d", e.Type, e.Code)
}

// icmpWatch is a raw socket that sees every ICMP message reaching a host,
// opened before an ask so that the error about it is queued there.
type icmpWatch struct {
	fd int
	v6 bool
}

// icmpWait bounds the wait for an ICMP error not yet queued when the ask
// failed: the error about it is sent before the ask learns of it, so it
// is there or close.
const icmpWait = 50 * time.Millisecond

func (h *Host) watchICMP(v6 bool) (*icmpWatch, error) {
	fam, proto := unix.AF_INET, unix.IPPROTO_ICMP
	if v6 {
		fam, proto = unix.AF_INET6, unix.IPPROTO_ICMPV6
	}
	var fd int
	err := h.Do(func() (err error) {
		fd, err = unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("icmp watch socket: %w", err)
	}
	return &icmpWatch{fd: fd, v6: v6}, nil
}

func (w *icmpWatch) close() { unix.Close(w.fd) }

// flowID names the packet an ICMP error is about: its protocol, source
// port and destination, so that an ask finds its own error among those
// of asks made at the same time from the same host.
type flowID struct {
	proto uint8
	sport uint16
	dst   netip.AddrPort
}

// find returns the first ICMP error about a packet of flow f, or nil:
// every message queued is read whatever the time, and one not yet queued
// is waited for until the time until. So a reader that runs late (a busy
// machine, an emulated guest) still finds the error that arrived in time;
// a deadline on the socket would give up before reading what is there.
func (w *icmpWatch) find(f flowID, until time.Time) *ICMPError {
	buf := make([]byte, 1500)
	for {
		n, _, err := unix.Recvfrom(w.fd, buf, unix.MSG_DONTWAIT)
		switch {
		case err == nil:
			if e, about := parseICMP(buf[:n], w.v6); e != nil && about == f {
				return e
			}
			continue
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return nil
		}
		left := time.Until(until)
		if left <= 0 {
			return nil
		}
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left.Milliseconds())+1); err != nil && err != unix.EINTR {
			return nil
		}
	}
}

// parseICMP parses an ICMP error as a raw socket delivers it (IPv4 with its
// IP header, ICMPv6 without), and returns it with the flow of the packet
// it is about; nil for other messages.
func parseICMP(b []byte, v6 bool) (*ICMPError, flowID) {
	if !v6 {
		if len(b) < 20 {
			return nil, flowID{}
		}
		b = b[int(b[0]&0x0f)*4:]
	}
	if len(b) < 8 {
		return nil, flowID{}
	}
	e := &ICMPError{V6: v6, Type: b[0], Code: b[1]}
	inner := b[8:]
	var f flowID
	var dst netip.Addr
	var l4 []byte
	switch {
	case !v6 && e.Type == 3 && len(inner) >= 20:
		f.proto, dst = inner[9], netip.AddrFrom4([4]byte(inner[16:20]))
		l4 = inner[int(inner[0]&0x0f)*4:]
	case v6 && e.Type == 1 && len(inner) >= 40:
		f.proto, dst = inner[6], netip.AddrFrom16([16]byte(inner[24:40]))
		l4 = inner[40:]
	default:
		return nil, flowID{}
	}
	if len(l4) < 4 {
		return nil, flowID{}
	}
	f.sport, f.dst = binary.BigEndian.Uint16(l4[0:2]), netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:4]))
	return e, f
}
