//go:build vm

package netnstest

import (
	"io"
	"net/netip"
	"os"
	"testing"
	"time"
)

// TestSCTPThroughNATOutlivesHeartbeats: an SCTP ask from the node to an
// address the node translates to a backend and masquerades, as a
// service's cluster IP, is answered although it lasts past the
// heartbeat the endpoint sends once its first retransmission timeout
// passes, whether or not it names a source port (the conformance kit's
// asks do) and in both families. Each ask holds its association 1 s
// before it sends, as a busy machine would: an ask bound to the
// wildcard address lists the node's other addresses in its INIT, the
// endpoint probes them around the translation, and the node's ABORT
// ends the association ("connection reset by peer").
func TestSCTPThroughNATOutlivesHeartbeats(t *testing.T) {
	Require(t, "sctp", "nf_tables")
	tp := New(t, Options{Backends: 2}) // the node then has addresses on three links
	b := tp.Backends[0]
	b.Serve(t, "sctp", 9000)
	vip4, vip6 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")
	tp.Node.Exec(t, "ip", "route", "add", vip4.String()+"/32", "dev", ClientLink)
	tp.Node.Exec(t, "ip", "-6", "route", "add", vip6.String()+"/128", "dev", ClientLink)
	tp.Node.Exec(t, "nft", "add table inet svc; "+
		"add chain inet svc out { type nat hook output priority -100; }; "+
		"add rule inet svc out ip daddr "+vip4.String()+" sctp dport 80 dnat ip to "+b.IPv4.String()+":9000; "+
		"add rule inet svc out ip6 daddr "+vip6.String()+" sctp dport 80 dnat ip6 to ["+b.IPv6.String()+"]:9000; "+
		"add chain inet svc post { type nat hook postrouting priority 100; }; "+
		"add rule inet svc post ct status dnat masquerade")
	port := uint16(61000)
	for _, vip := range []netip.Addr{vip4, vip6} {
		wildcard := netip.IPv4Unspecified()
		if vip.Is6() {
			wildcard = netip.IPv6Unspecified()
		}
		for _, from := range []netip.AddrPort{{}, netip.AddrPortFrom(wildcard, port)} {
			port++
			dst := netip.AddrPortFrom(vip, 80)
			got, err := askHolding(tp.Node, dst, from, time.Second)
			if err != nil || got == "" {
				t.Errorf("sctp %s from %s, held 1s: %q, %v", dst, from, got, err)
			}
		}
	}
}

// askHolding makes an SCTP ask as askStream does, holding the
// association for hold before it sends.
func askHolding(h *Host, dst, from netip.AddrPort, hold time.Duration) (string, error) {
	var f *os.File
	if err := h.Do(func() (err error) { f, err = dialStream("sctp", dst, from); return err }); err != nil {
		return "", err
	}
	defer f.Close()
	deadline := time.Now().Add(hold + 5*time.Second)
	if err := waitConnected(f, deadline); err != nil {
		return "", err
	}
	time.Sleep(hold)
	f.SetDeadline(deadline)
	if _, err := f.Write([]byte(request)); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(f, 512))
	return string(b), err
}
