package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/metrics/testutil"
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
	"k8s.io/kubernetes/pkg/proxy/apis/config"
	"k8s.io/kubernetes/pkg/proxy/iptables"
	"k8s.io/kubernetes/pkg/proxy/metrics"
	"k8s.io/kubernetes/pkg/proxy/nftables"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
	utiliptables "k8s.io/kubernetes/pkg/util/iptables"
	"k8s.io/utils/ptr"

	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"
)

// provider is what both of kube-proxy's proxiers offer.
type provider interface {
	OnServiceAdd(*v1.Service)
	OnServiceDelete(*v1.Service)
	OnServiceSynced()
	OnEndpointSliceAdd(*discovery.EndpointSlice)
	OnEndpointSliceUpdate(old, cur *discovery.EndpointSlice)
	OnEndpointSliceDelete(*discovery.EndpointSlice)
	OnEndpointSlicesSynced()
}

type driver struct {
	p       provider
	n, m    int
	svcs    []benchwork.Service
	slices  []*discovery.EndpointSlice
	digest  string
	changes int
	added   int
}

func newDriver(ctx context.Context, backend string, n, m int) (*driver, error) {
	d := &driver{n: n, m: m, svcs: benchwork.Generate(n, m)}
	d.digest = benchwork.Digest(d.svcs)
	detect := proxyutil.NewDetectLocalByCIDR(benchwork.ClusterCIDR)
	nodeIP := net.ParseIP(benchwork.NodeIP)
	rec := &events.FakeRecorder{}
	// A sync period of an hour: every sync the driver times is one it
	// asks for.
	var err error
	switch backend {
	case "nftables":
		metrics.RegisterMetrics(config.ProxyModeNFTables)
		d.p, err = nftables.NewProxier(ctx, v1.IPv4Protocol, time.Hour, 0, false, 14,
			detect, benchwork.Node, nodeIP, rec, nil, nil, false)
	case "iptables":
		metrics.RegisterMetrics(config.ProxyModeIPTables)
		d.p, err = iptables.NewProxier(ctx, v1.IPv4Protocol, utiliptables.New(utiliptables.ProtocolIPv4),
			utilsysctl.New(), time.Hour, 0, false, false, 14,
			detect, benchwork.Node, nodeIP, rec, nil, nil, false)
	default:
		err = fmt.Errorf("unknown backend %q", backend)
	}
	if err != nil {
		return nil, err
	}
	for _, s := range d.svcs {
		sl := endpointSlice(s)
		d.slices = append(d.slices, sl)
		d.p.OnServiceAdd(serviceObject(s))
		d.p.OnEndpointSliceAdd(sl)
	}
	return d, nil
}

func serviceObject(s benchwork.Service) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchwork.Namespace, Name: s.Name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  s.VIP.String(),
			ClusterIPs: []string{s.VIP.String()},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports: []v1.ServicePort{{
				Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
}

func endpointSlice(s benchwork.Service) *discovery.EndpointSlice {
	eps := make([]discovery.Endpoint, len(s.Endpoints))
	for j, e := range s.Endpoints {
		eps[j] = discovery.Endpoint{
			Addresses:  []string{e.Addr.String()},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(e.Node),
		}
	}
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: benchwork.Namespace, Name: s.Name + "-1",
			Labels: map[string]string{discovery.LabelServiceName: s.Name},
		},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
}

// lastSync is the time of the proxier's last successful sync.
func lastSync() float64 {
	v, _ := testutil.GetGaugeMetricValue(metrics.SyncProxyRulesLastTimestamp.WithLabelValues(string(v1.IPv4Protocol)))
	return v
}

// timed runs f, a synchronous sync, and fails when it did not succeed.
func timed(f func()) (time.Duration, error) {
	before := lastSync()
	t0 := time.Now()
	f()
	el := time.Since(t0)
	if lastSync() == before {
		return el, fmt.Errorf("sync failed (see the driver's log)")
	}
	return el, nil
}

// coldSync tells the proxier that every service and slice is known: its
// first sync, which writes everything.
func (d *driver) coldSync() (float64, error) {
	d.p.OnServiceSynced()
	el, err := timed(d.p.OnEndpointSlicesSynced)
	return float64(el.Nanoseconds()) / 1e6, err
}

// resync runs a sync of the pending changes: OnServiceSynced syncs at
// once, where the event handlers only queue a sync for the proxier's
// runner.
func (d *driver) resync() (time.Duration, error) { return timed(d.p.OnServiceSynced) }

func (d *driver) changeSamples(k, ms int) ([]float64, error) {
	return benchwork.Budget(k, ms, func(int) (time.Duration, error) {
		i, j := benchwork.ChangeTarget(d.changes, d.n, d.m)
		s := d.svcs[i]
		s.Endpoints = slices.Clone(s.Endpoints)
		s.Endpoints[j].Addr = benchwork.EndpointIP(benchwork.BaseReplacements, d.changes)
		d.changes++
		d.svcs[i] = s
		old := d.slices[i]
		d.slices[i] = endpointSlice(s)
		d.p.OnEndpointSliceUpdate(old, d.slices[i])
		return d.resync()
	})
}

func (d *driver) serviceSamples(k, ms int) (add, del []float64, err error) {
	var added []benchwork.Service
	add, err = benchwork.Budget(k, ms, func(int) (time.Duration, error) {
		s := benchwork.Added(d.added, d.m)
		d.added++
		added = append(added, s)
		d.p.OnServiceAdd(serviceObject(s))
		d.p.OnEndpointSliceAdd(endpointSlice(s))
		return d.resync()
	})
	if err != nil {
		return add, nil, err
	}
	del, err = benchwork.Budget(len(added), 1<<30, func(i int) (time.Duration, error) {
		d.p.OnServiceDelete(serviceObject(added[i]))
		d.p.OnEndpointSliceDelete(endpointSlice(added[i]))
		return d.resync()
	})
	return add, del, err
}
