//go:build vm

package smoke

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/kproxy-dev/kproxy/internal/ipvsnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/ipset"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestGuestKernel proves the guest kernel has what the dataplanes need,
// each feature driven through netlink and read back with its own tool.
func TestGuestKernel(t *testing.T) {
	netnstest.Require(t, "ip_vs", "dummy", "veth", "bridge", "sctp", "ipset", "nf_tables", "nft_compat", "nat", "conntrack")
	n := netnstest.NewHost(t, "guest")
	h, err := netlink.NewHandleAt(n.NS, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	t.Run("dummy", func(t *testing.T) { testDummy(t, n, h) })
	t.Run("veth", func(t *testing.T) { testVeth(t, n, h) })
	t.Run("ipvs", func(t *testing.T) { testIPVS(t, n) })
	t.Run("nftables", func(t *testing.T) { testNftables(t, n) })
	t.Run("iptables-nft", func(t *testing.T) { testIptables(t, n) })
	t.Run("ipset", func(t *testing.T) { testIPSet(t, n) })
	t.Run("conntrack", func(t *testing.T) { n.Exec(t, "conntrack", "-L") })
	t.Run("sctp", func(t *testing.T) { testSCTP(t, n) })
}

func testDummy(t *testing.T, n *netnstest.Host, h *netlink.Handle) {
	link := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "kpt-dummy0"}}
	if err := h.LinkAdd(link); err != nil {
		t.Fatalf("add dummy link: %v", err)
	}
	addr, _ := netlink.ParseAddr("10.96.0.10/32")
	if err := h.AddrAdd(link, addr); err != nil {
		t.Fatalf("add address: %v", err)
	}
	if out := n.Exec(t, "ip", "-d", "addr", "show", "kpt-dummy0"); !strings.Contains(out, "dummy") || !strings.Contains(out, "10.96.0.10/32") {
		t.Fatalf("ip addr show: no dummy link with 10.96.0.10:\n%s", out)
	}
}

func testVeth(t *testing.T, n *netnstest.Host, h *netlink.Handle) {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kpt-veth0"}, PeerName: "kpt-veth1"}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatalf("add veth pair: %v", err)
	}
	if out := n.Exec(t, "ip", "link", "show", "kpt-veth1"); !strings.Contains(out, "kpt-veth1@kpt-veth0") {
		t.Fatalf("ip link show: no veth peer:\n%s", out)
	}
}

func testIPVS(t *testing.T, n *netnstest.Host) {
	c, err := ipvsnl.Open(t.Context(), ipvsnl.Options{NetNS: int(n.NS)})
	if err != nil {
		t.Fatalf("ipvs netlink: %v", err)
	}
	defer c.Close()
	for i, sched := range []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh"} {
		svc := &ipvsnl.Service{Addr: netip.MustParseAddr("10.96.0.10"), Protocol: unix.IPPROTO_TCP, Port: uint16(80 + i),
			Scheduler: sched, Family: unix.AF_INET, Netmask: 0xffffffff}
		dst := &ipvsnl.Dest{Addr: netip.MustParseAddr("10.0.1.2"), Port: 8080, Weight: 1, FwdMethod: ipvsnl.Masquerade}
		b := c.Batch()
		b.NewService(svc)
		b.NewDest(svc, dst)
		errs, err := c.Send(t.Context(), b)
		if err != nil {
			t.Fatal(err)
		}
		if errs[0] != nil {
			t.Fatalf("add virtual server with scheduler %s: %v", sched, errs[0])
		}
		if errs[1] != nil {
			t.Fatalf("add real server: %v", errs[1])
		}
	}
	out := n.Exec(t, "ipvsadm", "-Sn")
	for _, want := range []string{"-A -t 10.96.0.10:80 -s rr", "-a -t 10.96.0.10:80 -r 10.0.1.2:8080 -m -w 1", "-A -t 10.96.0.10:92 -s mh"} {
		if !strings.Contains(out, want) {
			t.Errorf("ipvsadm -Sn lacks %q:\n%s", want, out)
		}
	}
}

func testNftables(t *testing.T, n *netnstest.Host) {
	c, err := nftables.New(nftables.WithNetNSFd(int(n.NS)))
	if err != nil {
		t.Fatal(err)
	}
	c.AddTable(&nftables.Table{Name: "kpt_smoke", Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		t.Fatalf("add nft table: %v", err)
	}
	if out := n.Exec(t, "nft", "list", "tables"); !strings.Contains(out, "table inet kpt_smoke") {
		t.Fatalf("nft list tables:\n%s", out)
	}
}

func testIptables(t *testing.T, n *netnstest.Host) {
	n.Exec(t, "iptables-nft", "-t", "nat", "-N", "KPT-SMOKE")
	n.Exec(t, "iptables-nft", "-t", "nat", "-A", "KPT-SMOKE", "-p", "tcp", "-m", "statistic", "--mode", "random",
		"--probability", "0.5", "-m", "comment", "--comment", "smoke", "-j", "DNAT", "--to-destination", "10.0.1.2:8080")
	if out := n.Exec(t, "iptables-nft-save", "-t", "nat"); !strings.Contains(out, "-A KPT-SMOKE") {
		t.Fatalf("iptables-nft-save:\n%s", out)
	}
}

// testIPSet drives every set type kproxy uses through the ipset package
// and reads them back with the ipset tool.
func testIPSet(t *testing.T, n *netnstest.Host) {
	c, err := ipset.New(ipset.Options{NetNS: n.NS, Prefix: "KPT-"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()
	ip, tcp := netip.MustParseAddr, ipset.TCP
	net := netip.MustParsePrefix("10.244.0.0/16")
	for _, s := range []struct {
		set   ipset.Set
		entry ipset.Entry
		save  string
	}{
		{ipset.Set{Name: "IP", Type: ipset.HashIP, Family: ipset.IPv4}, ipset.Entry{IP: ip("10.96.0.10")}, "add KPT-IP 10.96.0.10"},
		{ipset.Set{Name: "IPPORT", Type: ipset.HashIPPort, Family: ipset.IPv6, Comment: true}, ipset.Entry{IP: ip("fd00::10"), Protocol: tcp, Port: 80, Comment: "web"}, `add KPT-IPPORT fd00::10,tcp:80 comment "web"`},
		{ipset.Set{Name: "IPPORTIP", Type: ipset.HashIPPortIP, Family: ipset.IPv4}, ipset.Entry{IP: ip("10.0.1.2"), Protocol: tcp, Port: 80, IP2: ip("10.0.1.2")}, "add KPT-IPPORTIP 10.0.1.2,tcp:80,10.0.1.2"},
		{ipset.Set{Name: "IPPORTNET", Type: ipset.HashIPPortNet, Family: ipset.IPv4}, ipset.Entry{IP: ip("10.96.0.10"), Protocol: tcp, Port: 80, Net: net}, "add KPT-IPPORTNET 10.96.0.10,tcp:80,10.244.0.0/16"},
		{ipset.Set{Name: "NET", Type: ipset.HashNet, Family: ipset.IPv4, Timeout: time.Minute}, ipset.Entry{Net: net}, "add KPT-NET 10.244.0.0/16 timeout "},
		{ipset.Set{Name: "PORT", Type: ipset.BitmapPort, PortFrom: 0, PortTo: 65535}, ipset.Entry{Port: 30080}, "add KPT-PORT 30080"},
	} {
		if err := c.Create(ctx, s.set); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Sync(ctx, s.set.Name, []ipset.Entry{s.entry}); err != nil {
			t.Fatal(err)
		}
		if out := n.Exec(t, "ipset", "save", c.KernelName(s.set.Name)); !strings.Contains(out, s.save) {
			t.Errorf("ipset save lacks %q:\n%s", s.save, out)
		}
	}
}

func testSCTP(t *testing.T, n *netnstest.Host) {
	err := n.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
		if err != nil {
			return fmt.Errorf("SCTP socket: %w", err)
		}
		return unix.Close(fd)
	})
	if err != nil {
		t.Fatal(err)
	}
}
