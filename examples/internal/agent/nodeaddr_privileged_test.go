//go:build privileged

package agent

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestNodePortsFollowAddresses runs the agent on the nftables backend in
// a sandbox and adds an address to the node: by default node ports are
// served on every local address, the new one from the next sync on; with
// --nodeport-addresses primary, only on --node-ips.
func TestNodePortsFollowAddresses(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tc := range []struct {
		name, addrs string
		served      bool
	}{{"every local address", "", true}, {"primary", "primary", false}} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := sandbox.New(sandbox.Options{Backends: 1})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, sb.Close()) })
			require.NoError(t, sb.Backends[0].ServeHTTP(8080))

			cfg := defaults()
			cfg.Backend, cfg.NetNS, cfg.NodeName, cfg.NodeIPs = "nftables", sb.Node.NSName, "n1", sandbox.NodeAddr.String()
			cfg.NodePortAddresses, cfg.MinSyncInterval = tc.addrs, 10*time.Millisecond
			a, err := New(Options{Config: cfg})
			require.NoError(t, err)
			t.Cleanup(a.Close)
			src := a.Runner().Source("test")
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				<-done
			})
			require.NoError(t, src.Upsert(servicelb.Service{Name: "ns/web",
				Ports:     []servicelb.Port{{Port: 80, TargetPort: 8080, NodePort: 30080}},
				Endpoints: []servicelb.Endpoint{{Addr: sandbox.BackendAddr(1)}}}))
			src.Synced()
			get := func(a netip.Addr) error {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_, err := sb.Get(ctx, "http://"+netip.AddrPortFrom(a, 30080).String()+"/")
				return err
			}
			require.Eventually(t, func() bool { return get(sandbox.NodeAddr) == nil }, 5*time.Second, 20*time.Millisecond)

			extra := netip.MustParseAddr("10.100.9.9")
			require.NoError(t, addLoopbackAddr(sb, extra))
			if tc.served {
				require.Eventually(t, func() bool { return get(extra) == nil }, 5*time.Second, 20*time.Millisecond,
					"the node port is not served on the new address")
				return
			}
			time.Sleep(300 * time.Millisecond) // many sync intervals
			assert.Error(t, get(extra), "the node port is served on an address --nodeport-addresses leaves out")
			assert.NoError(t, get(sandbox.NodeAddr))
		})
	}
}

// addLoopbackAddr puts a on the node's loopback link, where the client
// reaches it through its default route.
func addLoopbackAddr(sb *sandbox.Sandbox, a netip.Addr) error {
	h, err := netlink.NewHandleAt(sb.Node.NS, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}})
}
