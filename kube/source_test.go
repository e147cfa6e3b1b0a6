package kube

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

func annotated(sl *discoveryv1.EndpointSlice, at time.Time) *discoveryv1.EndpointSlice {
	sl.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
	return sl
}

// TestTriggerTimes: a change of an EndpointSlice reaches the runner with
// the slice's last-change trigger time, one of the Service with none (its
// arrival), and the times of slices older than the source are ignored.
func TestTriggerTimes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ep := func(addr string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	c := k8sfake.NewClientset(svc(nil), annotated(slice("web-a", discoveryv1.AddressTypeIPv4, ep("10.244.1.2")), old))

	results := make(chan servicelb.SyncResult, 10)
	r, err := servicelb.NewRunner(&fake.Proxier{}, servicelb.RunnerOptions{
		MinSyncInterval: time.Millisecond,
		Hooks:           servicelb.Hooks{Synced: func(res servicelb.SyncResult) { results <- res }},
	})
	require.NoError(t, err)
	src := &Source{Client: c}
	dst := r.Source(src.Name())
	go func() { _ = r.Run(ctx) }()
	go func() { _ = src.Run(ctx, dst, func(o string, err error) { t.Errorf("%s: %v", o, err) }) }()
	next := func() servicelb.SyncResult {
		t.Helper()
		for {
			select {
			case res := <-results:
				if res.Services > 0 {
					return res
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no sync")
			}
		}
	}
	// The Service's and the slice's arrivals may reach the first sync
	// together, or the Service's alone.
	first := next()
	require.NotEmpty(t, first.Triggered)
	for _, at := range first.Triggered {
		assert.True(t, at.After(old.Add(30*time.Minute)), "the slice's time, older than the source, is not taken: %s", at)
	}

	cause := time.Now().Add(time.Second).Truncate(time.Millisecond)
	sl := annotated(slice("web-a", discoveryv1.AddressTypeIPv4, ep("10.244.1.2"), ep("10.244.1.3")), cause)
	_, err = c.DiscoveryV1().EndpointSlices("ns").Update(ctx, sl, metav1.UpdateOptions{})
	require.NoError(t, err)
	assert.Equal(t, []int64{cause.UnixNano()}, unixNanos(next().Triggered), "a slice changed: its trigger time")

	before := time.Now()
	_, err = c.CoreV1().Services("ns").Update(ctx, svc(func(s *corev1.Service) { s.Spec.Ports[0].Port = 81 }), metav1.UpdateOptions{})
	require.NoError(t, err)
	got := next().Triggered
	require.Len(t, got, 1)
	assert.False(t, got[0].Before(before), "a service changed: its arrival, not the slice's time")
}

func unixNanos(ts []time.Time) []int64 {
	var out []int64
	for _, t := range ts {
		out = append(out, t.UnixNano())
	}
	return out
}

func TestSliceTriggerTime(t *testing.T) {
	since := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := since.Add(1500 * time.Millisecond)
	sl := annotated(slice("a", discoveryv1.AddressTypeIPv4), at)
	assert.True(t, at.Equal(sliceTriggerTime(sl, since)))
	assert.Zero(t, sliceTriggerTime(sl, at), "not after the source's start")
	sl.Annotations[corev1.EndpointsLastChangeTriggerTime] = "yesterday"
	assert.Zero(t, sliceTriggerTime(sl, since))
	assert.Zero(t, sliceTriggerTime(svc(nil), since))
}

// TestSourceFollowsNodeAndServiceCIDRs: the source tells its Node's facts
// and the ServiceCIDRs' prefixes, first and at each change; with
// WaitPodCIDRs it reports itself synced (so that the Runner syncs) only
// once the Node has pod CIDRs, and never gives up.
func TestSourceFollowsNodeAndServiceCIDRs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.11"}}}}
	cidr := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}
	c := k8sfake.NewClientset(svc(nil), node, cidr)
	r, err := servicelb.NewRunner(&fake.Proxier{}, servicelb.RunnerOptions{MinSyncInterval: time.Millisecond})
	require.NoError(t, err)
	nodes, cidrs := make(chan Node, 10), make(chan []netip.Prefix, 10)
	src := &Source{Client: c, NodeName: "n1", WaitPodCIDRs: true,
		OnNode: func(n Node) { nodes <- n }, OnServiceCIDRs: func(p []netip.Prefix) { cidrs <- p }}
	go func() { _ = r.Run(ctx) }()
	go func() {
		_ = src.Run(ctx, r.Source(src.Name()), func(o string, err error) { t.Errorf("%s: %v", o, err) })
	}()
	recv := func(ch <-chan Node) Node {
		t.Helper()
		select {
		case n := <-ch:
			return n
		case <-time.After(10 * time.Second):
			t.Fatal("no node reading")
			return Node{}
		}
	}
	n := recv(nodes)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("10.0.0.11")}, n.IPs)
	assert.Empty(t, n.PodCIDRs)
	select {
	case p := <-cidrs:
		assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}, p)
	case <-time.After(10 * time.Second):
		t.Fatal("no service CIDRs")
	}
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	assert.Error(t, r.WaitSynced(short), "no sync while the node has no pod CIDRs")
	stop()

	node.Spec.PodCIDRs = []string{"10.244.1.0/24"}
	node.Labels = map[string]string{LabelZone: "zone-a"}
	_, err = c.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	require.NoError(t, err)
	n = recv(nodes)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, n.PodCIDRs)
	assert.Equal(t, "zone-a", n.Zone)
	long, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	require.NoError(t, r.WaitSynced(long), "synced once the node has pod CIDRs")
	assert.True(t, src.NodeEligible())

	require.NoError(t, c.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}))
	assert.Equal(t, "no Node object of this name", recv(nodes).Ineligible)
	assert.False(t, src.NodeEligible())
}
