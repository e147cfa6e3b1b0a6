//go:build linux

package netnstest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// connTimeout bounds how long an echo server waits on one client.
const connTimeout = 5 * time.Second

// request is what Ask sends; servers read up to its newline.
const request = "ask\n"

// Server is a running echo server. Serve stops it when the test ends;
// Close stops it earlier (to take an endpoint away, say).
type Server struct {
	closers []io.Closer
	wg      sync.WaitGroup
	once    sync.Once
}

// Close stops the server and waits for its goroutines.
func (s *Server) Close() {
	s.once.Do(func() {
		for _, c := range s.closers {
			c.Close()
		}
		s.wg.Wait()
	})
}

// reply formats the echo servers' answer: the host's name, the client as
// the server saw it, and the port the server answered on.
func (h *Host) reply(client netip.AddrPort, port uint16) []byte {
	return fmt.Appendf(nil, "%s %s %d\n", h.Name, netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), port)
}

// Serve starts an echo server for proto ("tcp", "udp" or "sctp") on port,
// listening on every address of the host, IPv4 and IPv6, with sockets
// created in its namespace. Each reply is "<host name> <client addr:port>
// <port>": the client as the server saw it, and the port it answered on. The server stops when the test ends.
func (h *Host) Serve(t testing.TB, proto string, port uint16) *Server {
	t.Helper()
	s := &Server{}
	var err error
	switch proto {
	case "tcp":
		err = h.serveTCP(s, port)
	case "udp":
		err = h.serveUDP(s, port)
	case "sctp":
		err = h.serveSCTP(s, port)
	default:
		err = fmt.Errorf("unknown protocol %q (want tcp, udp or sctp)", proto)
	}
	t.Cleanup(s.Close)
	if err != nil {
		s.Close()
		t.Fatalf("netnstest: %s: serve %s/%d: %v", h.Name, proto, port, err)
	}
	return s
}

func (h *Host) serveTCP(s *Server, port uint16) error {
	for _, network := range []string{"tcp4", "tcp6"} {
		var ln net.Listener
		err := h.Do(func() (err error) {
			ln, err = new(net.ListenConfig).Listen(context.Background(), network, fmt.Sprintf(":%d", port))
			return err
		})
		if err != nil {
			return err
		}
		s.closers = append(s.closers, ln)
		s.wg.Go(func() { h.acceptTCP(s, ln, port) })
	}
	return nil
}

func (h *Host) acceptTCP(s *Server, ln net.Listener, port uint16) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.wg.Go(func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(connTimeout))
			if _, err := bufio.NewReader(c).ReadString('\n'); err != nil && err != io.EOF {
				return
			}
			c.Write(h.reply(c.RemoteAddr().(*net.TCPAddr).AddrPort(), port))
		})
	}
}

// serveUDP answers each datagram from the address it was sent to, read
// from the packet's control message, so that a reply always matches the
// conntrack entry of its request even on a host with several addresses.
func (h *Host) serveUDP(s *Server, port uint16) error {
	for _, network := range []string{"udp4", "udp6"} {
		var pc net.PacketConn
		err := h.Do(func() (err error) {
			pc, err = new(net.ListenConfig).ListenPacket(context.Background(), network, fmt.Sprintf(":%d", port))
			return err
		})
		if err != nil {
			return err
		}
		s.closers = append(s.closers, pc)
		if network == "udp4" {
			p := ipv4.NewPacketConn(pc)
			if err := p.SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true); err != nil {
				return fmt.Errorf("udp4 control messages: %w", err)
			}
			s.wg.Go(func() { h.answerUDP4(p, port) })
		} else {
			p := ipv6.NewPacketConn(pc)
			if err := p.SetControlMessage(ipv6.FlagDst|ipv6.FlagInterface, true); err != nil {
				return fmt.Errorf("udp6 control messages: %w", err)
			}
			s.wg.Go(func() { h.answerUDP6(p, port) })
		}
	}
	return nil
}

func (h *Host) answerUDP4(p *ipv4.PacketConn, port uint16) {
	buf := make([]byte, 2048)
	for {
		_, cm, src, err := p.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var out *ipv4.ControlMessage
		if cm != nil {
			out = &ipv4.ControlMessage{Src: cm.Dst}
		}
		p.WriteTo(h.reply(src.(*net.UDPAddr).AddrPort(), port), out, src)
	}
}

func (h *Host) answerUDP6(p *ipv6.PacketConn, port uint16) {
	buf := make([]byte, 2048)
	for {
		_, cm, src, err := p.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		var out *ipv6.ControlMessage
		if cm != nil {
			out = &ipv6.ControlMessage{Src: cm.Dst}
			if cm.Dst.IsLinkLocalUnicast() {
				out.IfIndex = cm.IfIndex
			}
		}
		p.WriteTo(h.reply(src.(*net.UDPAddr).AddrPort(), port), out, src)
	}
}
