package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Reporter is told about an object the Source could not translate, or
// could translate only in part, and why. The object is named
// "namespace/name". It is a plain function type, so that any function of
// this shape is one.
type Reporter = func(object string, err error)

// DefaultNodeWait is how long Run waits for its Node's addresses before
// it reports the source synced without them, as kube-proxy waits.
const DefaultNodeWait = 30 * time.Second

// Source feeds a servicelb.Source from Kubernetes, with client-go
// informers on Services and EndpointSlices, and follows this node's Node
// object and the cluster's ServiceCIDRs, as kube-proxy watches them:
//
//   - Services and EndpointSlices are read through kube-proxy's label
//     selector (services of this proxy's service-proxy-name, none
//     labelled headless), Services without a cluster IP are not read;
//   - every change of a service or of one of its slices translates that
//     service alone (Translate) and upserts it; a change of a slice
//     carries its endpoints.kubernetes.io/last-change-trigger-time to the
//     Runner (servicelb.Source.UpsertTriggered), so that the network
//     programming latency is measured from the Pod or Service change
//     behind it, as kube-proxy measures it;
//   - the Node (NodeName) is read by a field selector on its name, and
//     OnNode learns its facts (Node) each time they change;
//   - ServiceCIDR objects (networking.k8s.io/v1) are read whole, and
//     OnServiceCIDRs learns their prefixes each time they change.
//
// Run reports the source synced (servicelb.Source.Synced) once the
// informers hold the cluster's objects and, with a NodeName, the Node has
// been read (or NodeWait has passed, as kube-proxy goes on without its
// node's addresses), and, with WaitPodCIDRs, once the Node has pod CIDRs.
// An API server that is not up yet delays it: the informers try again,
// and nothing is programmed before, so that a restarted proxy never
// applies a partial state.
//
// It needs list and watch on services, endpointslices, nodes (its own)
// and servicecidrs: the ClusterRole of deploy/kubernetes grants them.
type Source struct {
	// Client talks to the API server.
	Client kubernetes.Interface
	// ProxyName is this proxy's value of the service-proxy-name label: with
	// a name, only services labelled with it are handled; without, only
	// services without the label.
	ProxyName string
	// NodeName names this node (see NodeName): its Node object is read.
	// Empty: no Node is read, and the node is always eligible.
	NodeName string
	// NodeWait bounds the wait for the Node before the source reports
	// itself synced; zero means DefaultNodeWait.
	NodeWait time.Duration
	// WaitPodCIDRs keeps the source from reporting itself synced until
	// the Node has pod CIDRs: the local traffic of detectLocalMode
	// NodeCIDR cannot be told before. It waits as long as it takes,
	// logging a warning every NodeWait, and the proxy programs nothing
	// meanwhile; kube-proxy gives up and exits after five minutes.
	WaitPodCIDRs bool
	// OnNode, when set, is told the Node's facts when first read and at
	// each change (a Node deleted reads as NodeOf(nil)).
	OnNode func(Node)
	// OnServiceCIDRs, when set, is told the prefixes of every ServiceCIDR
	// object, sorted, when first read and at each change.
	OnServiceCIDRs func([]netip.Prefix)
	// Logger receives skipped services at Debug, changes of the node at
	// Info and failed lists and watches at Warn; nil discards.
	Logger *slog.Logger

	mu       sync.Mutex
	started  time.Time
	dst      *servicelb.Source
	report   Reporter
	services cache.Indexer
	slices   cache.Indexer
	invalid  map[string]string // services reported, by their error text
	// nodes holds the Node of NodeName once Run watches it; node is its
	// last reading, nodeSeen whether one was read.
	nodes    cache.Store
	node     Node
	nodeSeen chan struct{}
	cidrs    []netip.Prefix
}

// Name returns "kubernetes".
func (s *Source) Name() string { return "kubernetes" }

const byService = "service"

// Selector returns kube-proxy's label selector of the Services and
// EndpointSlices a proxy of proxyName reads: labelled with it (without a
// name: without the label), and not labelled headless.
func Selector(proxyName string) labels.Selector {
	op, vals := selection.DoesNotExist, []string(nil)
	if proxyName != "" {
		op, vals = selection.Equals, []string{proxyName}
	}
	name, err := labels.NewRequirement(LabelProxyName, op, vals)
	if err != nil {
		panic(err) // the label key and values are constants or checked
	}
	headless, err := labels.NewRequirement(LabelHeadless, selection.DoesNotExist, nil)
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*name, *headless)
}

// Run starts the informers, feeds their initial contents, reports the
// source synced, and follows changes until ctx ends.
func (s *Source) Run(ctx context.Context, dst *servicelb.Source, report Reporter) error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if report == nil {
		report = func(string, error) {}
	}
	s.dst, s.report, s.invalid, s.started = dst, report, map[string]string{}, time.Now()
	sel := Selector(s.ProxyName).String()
	svcFactory := informers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = sel
			o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone).String()
		}))
	sliceFactory := informers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	svcInf := svcFactory.Core().V1().Services().Informer()
	sliceInf := sliceFactory.Discovery().V1().EndpointSlices().Informer()
	if err := s.setup(svcInf, sliceInf); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	factories := []informers.SharedInformerFactory{svcFactory, sliceFactory}
	if s.NodeName != "" {
		f, err := s.watchNode()
		if err != nil {
			return err
		}
		factories = append(factories, f)
	}
	cidrFactory, cidrInf, err := s.watchServiceCIDRs()
	if err != nil {
		return err
	}
	factories = append(factories, cidrFactory)
	for _, f := range factories {
		f.Start(ctx.Done())
		defer f.Shutdown()
	}
	if !cache.WaitForCacheSync(ctx.Done(), svcInf.HasSynced, sliceInf.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("kubernetes: informers did not sync")
	}
	s.waitServiceCIDRs(ctx, cidrInf)
	if !s.waitNode(ctx) {
		return nil
	}
	s.resyncAll()
	dst.Synced()
	s.Logger.Info("kubernetes informers synced", "services", len(s.services.ListKeys()), "proxyName", s.ProxyName)
	<-ctx.Done()
	return nil
}

// setup indexes the slices by service and hands both informers' events
// to update.
func (s *Source) setup(svcInf, sliceInf cache.SharedIndexInformer) error {
	if err := sliceInf.AddIndexers(cache.Indexers{byService: sliceService}); err != nil {
		return err
	}
	if err := svcInf.SetWatchErrorHandler(s.watchError("services")); err != nil {
		return err
	}
	if err := sliceInf.SetWatchErrorHandler(s.watchError("endpointslices")); err != nil {
		return err
	}
	s.services, s.slices = svcInf.GetIndexer(), sliceInf.GetIndexer()
	if _, err := svcInf.AddEventHandler(s.handler(s.serviceKey, nil)); err != nil {
		return err
	}
	_, err := sliceInf.AddEventHandler(s.handler(sliceKey, func(obj any) time.Time { return sliceTriggerTime(obj, s.started) }))
	return err
}

// watchNode prepares the informer of this node's Node object, as
// kube-proxy watches its own: by a field selector on its name.
func (s *Source) watchNode() (informers.SharedInformerFactory, error) {
	f := informers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = nodeSelector(s.NodeName) }))
	inf := f.Core().V1().Nodes().Informer()
	if err := inf.SetWatchErrorHandler(s.watchError("nodes")); err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	changed := func(any) { s.nodeChanged() }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed, UpdateFunc: func(_, cur any) { changed(cur) }, DeleteFunc: changed,
	}); err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	s.mu.Lock()
	s.nodes, s.node, s.nodeSeen = inf.GetStore(), NodeOf(nil), make(chan struct{})
	s.mu.Unlock()
	return f, nil
}

// nodeChanged reads the Node again and tells OnNode when it changed.
func (s *Source) nodeChanged() {
	s.mu.Lock()
	var obj *corev1.Node
	if o, ok, err := s.nodes.GetByKey(s.NodeName); err == nil && ok {
		obj, _ = o.(*corev1.Node)
	}
	n, was := NodeOf(obj), s.node
	first := obj != nil && !s.seen()
	if first {
		close(s.nodeSeen)
	}
	s.node = n
	s.mu.Unlock()
	if n.Equal(was) && !first {
		return
	}
	s.Logger.Info("node", "node", s.NodeName, "addresses", n.IPs, "podCIDRs", n.PodCIDRs, "zone", n.Zone, "ineligible", n.Ineligible)
	if s.OnNode != nil {
		s.OnNode(n)
	}
}

// seen reports whether the Node was read; s.mu is held.
func (s *Source) seen() bool {
	select {
	case <-s.nodeSeen:
		return true
	default:
		return false
	}
}

// waitNode waits for the Node (at most NodeWait) and, with WaitPodCIDRs,
// for its pod CIDRs (as long as it takes); false when ctx ended first.
func (s *Source) waitNode(ctx context.Context) bool {
	if s.NodeName == "" {
		return true
	}
	wait := s.NodeWait
	if wait <= 0 {
		wait = DefaultNodeWait
	}
	select {
	case <-s.nodeSeen:
	case <-time.After(wait):
		s.Logger.Warn("kubernetes: no Node of this name yet; going on without its addresses", "node", s.NodeName, "waited", wait)
	case <-ctx.Done():
		return false
	}
	warn := time.NewTicker(wait)
	defer warn.Stop()
	for s.WaitPodCIDRs {
		if n, _ := s.Node(); len(n.PodCIDRs) > 0 {
			break
		}
		select {
		case <-warn.C:
			s.Logger.Warn("kubernetes: the Node has no pod CIDRs yet; detectLocalMode NodeCIDR needs them: nothing is programmed until it has", "node", s.NodeName)
		case <-time.After(time.Second):
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// Node returns the Node's last reading, and whether the Node was read.
func (s *Source) Node() (Node, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodeSeen == nil {
		return NodeOf(nil), false
	}
	return s.node, s.seen()
}

// NodeEligible reports whether the node may take traffic: with a
// NodeName, whether its Node object is there, not being deleted and not
// tainted ToBeDeletedByClusterAutoscaler (see Ineligible); false until
// Run has read it. Without a NodeName, true.
func (s *Source) NodeEligible() bool {
	if s.NodeName == "" {
		return true
	}
	n, ok := s.Node()
	return ok && n.Ineligible == ""
}

// watchServiceCIDRs prepares the informer of the ServiceCIDR objects.
func (s *Source) watchServiceCIDRs() (informers.SharedInformerFactory, cache.SharedIndexInformer, error) {
	f := informers.NewSharedInformerFactory(s.Client, 0)
	inf := f.Networking().V1().ServiceCIDRs().Informer()
	if err := inf.SetWatchErrorHandler(s.watchError("servicecidrs")); err != nil {
		return nil, nil, fmt.Errorf("kubernetes: %w", err)
	}
	changed := func(any) { s.serviceCIDRsChanged(inf.GetStore()) }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed, UpdateFunc: func(_, cur any) { changed(cur) }, DeleteFunc: changed,
	}); err != nil {
		return nil, nil, fmt.Errorf("kubernetes: %w", err)
	}
	return f, inf, nil
}

// waitServiceCIDRs waits a little for the ServiceCIDRs: an API server
// without the resource (before Kubernetes 1.33) never lists them, and the
// service CIDRs then stay those configured.
func (s *Source) waitServiceCIDRs(ctx context.Context, inf cache.SharedIndexInformer) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		s.Logger.Warn("kubernetes: ServiceCIDRs not listed yet; unallocated cluster IPs are dropped by the configured service CIDRs alone until they are")
	}
}

// serviceCIDRsChanged tells OnServiceCIDRs the prefixes of every
// ServiceCIDR, when they changed.
func (s *Source) serviceCIDRsChanged(store cache.Store) {
	var out []netip.Prefix
	for _, o := range store.List() {
		sc, ok := o.(*networkingv1.ServiceCIDR)
		if !ok {
			continue
		}
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	out = slices.Compact(out)
	s.mu.Lock()
	same := slices.Equal(out, s.cidrs)
	s.cidrs = out
	s.mu.Unlock()
	if same {
		return
	}
	s.Logger.Info("service CIDRs", "cidrs", out)
	if s.OnServiceCIDRs != nil {
		s.OnServiceCIDRs(out)
	}
}

// ServiceCIDRs returns the prefixes of every ServiceCIDR, as last read.
func (s *Source) ServiceCIDRs() []netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.cidrs)
}

// watchError logs a failed list or watch of a resource (a permission
// refused, the API server gone), which the informer tries again with a
// backoff; a watch that merely ended is not logged.
func (s *Source) watchError(resource string) cache.WatchErrorHandler {
	return func(_ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return
		}
		s.Logger.Warn("kubernetes: list or watch failed; trying again", "resource", resource, "err", err)
	}
}

// handler calls update with the service key of each changed object, and
// the time the change was triggered, when trigger knows it.
func (s *Source) handler(key func(any) (string, bool), trigger func(any) time.Time) cache.ResourceEventHandlerFuncs {
	on := func(obj any, at time.Time) {
		if k, ok := key(obj); ok {
			s.update(k, at)
		}
	}
	changed := func(obj any) {
		var at time.Time
		if trigger != nil {
			at = trigger(obj)
		}
		on(obj, at)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: changed,
		UpdateFunc: func(old, cur any) {
			ko, _ := key(old)
			if kc, _ := key(cur); ko != kc {
				on(old, time.Time{})
			}
			changed(cur)
		},
		// A deleted object's trigger time is that of its last update.
		DeleteFunc: func(obj any) { on(obj, time.Time{}) },
	}
}

// sliceTriggerTime returns when the change behind an EndpointSlice was
// made, as the endpoint slice controller records it
// (corev1.EndpointsLastChangeTriggerTime); zero for another object, a
// slice that does not say, or a time not after since: a time before the
// source started would measure the age of the cluster rather than this
// proxy, and kube-proxy ignores those too.
func sliceTriggerTime(obj any, since time.Time) time.Time {
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, sl.Annotations[corev1.EndpointsLastChangeTriggerTime])
	if err != nil || !t.After(since) {
		return time.Time{}
	}
	return t
}

func (s *Source) serviceKey(obj any) (string, bool) {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return k, err == nil
}

func sliceKey(obj any) (string, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return "", false
	}
	name := sl.Labels[discoveryv1.LabelServiceName]
	return sl.Namespace + "/" + name, name != ""
}

func sliceService(obj any) ([]string, error) {
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || sl.Labels[discoveryv1.LabelServiceName] == "" {
		return nil, nil
	}
	return []string{sl.Namespace + "/" + sl.Labels[discoveryv1.LabelServiceName]}, nil
}

func (s *Source) resyncAll() {
	for _, k := range s.services.ListKeys() {
		s.update(k, time.Time{})
	}
}

// update translates the service with key "namespace/name" again and
// upserts or deletes it; trigger is when the change behind it was made,
// if known.
func (s *Source) update(key string, trigger time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dst == nil {
		return
	}
	obj, exists, err := s.services.GetByKey(key)
	if err != nil || !exists {
		s.delete(key)
		return
	}
	svc := obj.(*corev1.Service)
	objs, err := s.slices.ByIndex(byService, key)
	if err != nil {
		s.reportOnce(key, fmt.Errorf("endpointslices: %w", err))
		return
	}
	sls := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		sls = append(sls, o.(*discoveryv1.EndpointSlice))
	}
	t, err := Translate(svc, sls)
	if errors.Is(err, ErrSkipped) {
		s.Logger.Debug("skipping service", "service", key, "reason", err)
		s.delete(key)
		return
	}
	if err == nil {
		err = s.dst.UpsertTriggered(trigger, t.Service)
	}
	if err == nil && len(t.Skipped) > 0 {
		err = fmt.Errorf("parts left out: %w", errors.Join(t.Skipped...))
	}
	if err != nil {
		s.reportOnce(key, err)
		return
	}
	delete(s.invalid, key)
}

func (s *Source) delete(key string) {
	delete(s.invalid, key)
	if err := s.dst.Delete(key); err != nil {
		s.reportOnce(key, err)
	}
}

// reportOnce reports a service, once per distinct error, so that
// unrelated slice updates do not repeat it.
func (s *Source) reportOnce(key string, err error) {
	if s.invalid[key] == err.Error() {
		return
	}
	s.invalid[key] = err.Error()
	s.report(key, err)
}
