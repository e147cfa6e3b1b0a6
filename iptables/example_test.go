//go:build linux

package iptables_test

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// ExampleProxier_RenderFamily shows the rules a Proxier would install for
// one service, as iptables-save prints them: a dry run that needs no
// privileges (Sync would write the same rules). Only the service's own
// rules are printed here; the text also holds the fixed chains and the
// jumps from the builtin chains.
func ExampleProxier_RenderFamily() {
	px, err := iptables.New(iptables.Options{ChainPrefix: "KUBE-", Families: []servicelb.Family{servicelb.IPv4}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer px.Close()
	st, err := servicelb.NewState(servicelb.NodeConfig{NodeName: "node-a", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
		servicelb.Service{
			Name:       "default/web",
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints: []servicelb.Endpoint{
				{Addr: netip.MustParseAddr("10.244.1.2")},
				{Addr: netip.MustParseAddr("10.244.2.2")},
			},
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	text, err := px.RenderFamily(st, servicelb.IPv4)
	if err != nil {
		fmt.Println(err)
		return
	}
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "-A KUBE-SERVICES") || strings.HasPrefix(line, "-A KUBE-SVC-") || strings.HasPrefix(line, "-A KUBE-SEP-") {
			fmt.Print(line)
		}
	}
	// Output:
	// -A KUBE-SERVICES -d 10.96.0.10/32 -m comment --comment "default/web cluster IP: undefined port" -j REJECT --reject-with icmp-port-unreachable
	// -A KUBE-SEP-4EX2N4PG4ASNZOBF -s 10.244.2.2/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
	// -A KUBE-SEP-4EX2N4PG4ASNZOBF -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.2.2:8080
	// -A KUBE-SEP-UIQK3OSOSTRHRPBX -s 10.244.1.2/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
	// -A KUBE-SEP-UIQK3OSOSTRHRPBX -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.1.2:8080
	// -A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-CDGGSHYLG3RE2FKL
	// -A KUBE-SVC-CDGGSHYLG3RE2FKL ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
	// -A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.1.2:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-UIQK3OSOSTRHRPBX
	// -A KUBE-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.2.2:8080" -j KUBE-SEP-4EX2N4PG4ASNZOBF
}
