//go:build linux

package userspace

import (
	"context"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestRender compares Render's text with golden files (-update rewrites
// them): what the proxy holds and listens on, the verdicts by origin and
// the endpoints, for services of every kind.
func TestRender(t *testing.T) {
	node := servicelb.NodeConfig{
		NodeName:     "node-a",
		NodeIPs:      addrs("192.0.2.1", "2001:db8::1"),
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	}
	local := func(e servicelb.Endpoint) servicelb.Endpoint { e.NodeName = "node-a"; return e }
	web := service(1, weighted(2, ep(0)), local(ep(1)))
	web.ExternalIPs = addrs("203.0.113.7")
	web.LoadBalancerIPs = addrs("198.51.100.9")
	web.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	web.ExternalTrafficPolicy = servicelb.PolicyLocal
	web.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Hour}
	web.Scheduler = servicelb.SchedulerWeightedRR
	for i := range web.Ports {
		web.Ports[i].NodePort = 30080 + uint16(i)
	}
	empty := service(2)
	empty.ClusterIPs = append(empty.ClusterIPs, netip.MustParseAddr("fd00:96::2"))
	st := mustState(t, node, web, empty)
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"hold", Options{HoldAddresses: true}},
		{"listen-at", Options{Listen: ListenAt(map[servicelb.ServicePortKey]netip.AddrPort{
			key(1, "tcp"): netip.MustParseAddrPort("127.0.0.1:18080"),
			key(2, "udp"): netip.MustParseAddrPort("127.0.0.1:18053"),
		})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ForRendering(tc.o)
			require.NoError(t, err)
			defer p.Close()
			got, err := p.Render(st)
			require.NoError(t, err)
			file := filepath.Join("testdata", "render-"+tc.name+".txt")
			if *update {
				require.NoError(t, os.WriteFile(file, []byte(got), 0o644))
			}
			want, err := os.ReadFile(file)
			require.NoError(t, err)
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("Render (-want +got):\n%s", diff)
			}
		})
	}
}

// TestForRendering: a Proxier for rendering renders and declares what a
// working one does, and refuses to sync, clean up or hand over.
func TestForRendering(t *testing.T) {
	st := mustState(t, servicelb.NodeConfig{}, service(1, ep(0)))
	o := Options{Listen: ListenAt(map[servicelb.ServicePortKey]netip.AddrPort{key(1, "tcp"): netip.MustParseAddrPort("127.0.0.1:18080")})}
	live, err := New(o)
	require.NoError(t, err)
	defer live.Close()
	p, err := ForRendering(o)
	require.NoError(t, err)
	want, err := live.Render(st)
	require.NoError(t, err)
	got, err := p.Render(st)
	require.NoError(t, err)
	require.Equal(t, want, got)
	again, err := Render(st, o)
	require.NoError(t, err)
	require.Equal(t, want, again, "the package's Render")
	require.Equal(t, live.Capabilities(), p.Capabilities())
	require.ErrorIs(t, servicetest.SyncErr(p.Sync(context.Background(), st)), servicelb.ErrRenderOnly)
	require.ErrorIs(t, p.Cleanup(context.Background()), servicelb.ErrRenderOnly)
	a, _ := seqpacketPair(t)
	_, err = p.HandOver(context.Background(), a)
	require.ErrorIs(t, err, servicelb.ErrRenderOnly)
	require.NoError(t, p.Close())
}
