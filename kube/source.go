package kubesource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Source watches Services and EndpointSlices and feeds their translation
// to a runner. Every change to a service or one of its slices re-translates
// that service alone. A change of a slice carries its
// endpoints.kubernetes.io/last-change-trigger-time annotation to the
// runner (servicelb.Source.UpsertTriggered), so that the network
// programming latency is measured from the Pod or Service change behind
// it, as kube-proxy measures it.
type Source struct {
	// Client talks to the API server.
	Client kubernetes.Interface
	// ProxyName is this proxy's value of the service-proxy-name label: with
	// a name, only services labelled with it are handled; without, only
	// services without the label.
	ProxyName string
	// NodeName, when set, names this node: Run watches its Node object
	// (list and watch on nodes, the one object alone), and NodeEligible
	// reports whether the node may take traffic, as kube-proxy's
	// /healthz does. Empty: no Node is watched, and the node is always
	// eligible.
	NodeName string
	// Logger receives skipped services at Debug and changes of the node's
	// eligibility at Info; nil discards.
	Logger *slog.Logger

	mu       sync.Mutex
	started  time.Time
	dst      *servicelb.Source
	report   agent.Reporter
	services cache.Indexer
	slices   cache.Indexer
	invalid  map[string]string // services reported invalid, by their error text
	// nodes holds the Node of NodeName once Run watches it; ineligible
	// is why the node was last found not eligible ("": it was).
	nodes      cache.Store
	ineligible string
}

var (
	_ agent.Source      = (*Source)(nil)
	_ agent.NodeWatcher = (*Source)(nil)
)

const byService = "service"

// Name returns "kubernetes".
func (s *Source) Name() string { return "kubernetes" }

// Selector returns the label selector for the services this proxy handles.
func Selector(proxyName string) labels.Selector {
	op, vals := selection.DoesNotExist, []string(nil)
	if proxyName != "" {
		op, vals = selection.Equals, []string{proxyName}
	}
	req, err := labels.NewRequirement(LabelProxyName, op, vals)
	if err != nil {
		panic(err) // the label key and values are constants or checked
	}
	return labels.NewSelector().Add(*req)
}

// Run starts the informers, feeds their initial contents, reports the
// source synced, and follows changes until ctx ends.
func (s *Source) Run(ctx context.Context, dst *servicelb.Source, report agent.Reporter) error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	s.dst, s.report, s.invalid, s.started = dst, report, map[string]string{}, time.Now()
	sel := Selector(s.ProxyName).String()
	svcFactory := informers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	// As kube-proxy: no slice labelled headless is read, whatever its
	// service.
	sliceFactory := informers.NewSharedInformerFactoryWithOptions(s.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "!" + LabelHeadless }))
	svcInf := svcFactory.Core().V1().Services().Informer()
	sliceInf := sliceFactory.Discovery().V1().EndpointSlices().Informer()
	if err := sliceInf.AddIndexers(cache.Indexers{byService: sliceService}); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	if err := svcInf.SetWatchErrorHandler(s.watchError("services")); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	if err := sliceInf.SetWatchErrorHandler(s.watchError("endpointslices")); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	s.services, s.slices = svcInf.GetIndexer(), sliceInf.GetIndexer()
	if _, err := svcInf.AddEventHandler(s.handler(s.serviceKey, nil)); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	if _, err := sliceInf.AddEventHandler(s.handler(s.sliceKey, func(obj any) time.Time { return sliceTriggerTime(obj, s.started) })); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	if s.NodeName != "" {
		nodeFactory, err := s.watchNode()
		if err != nil {
			return err
		}
		nodeFactory.Start(ctx.Done())
		defer nodeFactory.Shutdown()
	}
	svcFactory.Start(ctx.Done())
	sliceFactory.Start(ctx.Done())
	defer svcFactory.Shutdown()
	defer sliceFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), svcInf.HasSynced, sliceInf.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("kubernetes: informers did not sync")
	}
	s.resyncAll()
	dst.Synced()
	s.Logger.Info("kubernetes informers synced", "services", len(s.services.ListKeys()), "proxyName", s.ProxyName)
	<-ctx.Done()
	return nil
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
	s.nodes, s.ineligible = inf.GetStore(), Ineligible(nil)
	s.mu.Unlock()
	return f, nil
}

// NodeEligible reports whether the node may take traffic: with a
// NodeName, whether its Node object is there, not being deleted and not
// tainted ToBeDeletedByClusterAutoscaler (see Ineligible); false until
// Run has seen it. Without a NodeName, true.
func (s *Source) NodeEligible() bool {
	if s.NodeName == "" {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes != nil && Ineligible(s.node()) == ""
}

// node returns this node's Node object, or nil; s.mu is held.
func (s *Source) node() *corev1.Node {
	obj, ok, err := s.nodes.GetByKey(s.NodeName)
	if err != nil || !ok {
		return nil
	}
	n, _ := obj.(*corev1.Node)
	return n
}

// nodeChanged logs a change of the node's eligibility.
func (s *Source) nodeChanged() {
	s.mu.Lock()
	why, was := Ineligible(s.node()), s.ineligible
	s.ineligible = why
	s.mu.Unlock()
	switch {
	case why == was:
	case why == "":
		s.Logger.Info("the node is eligible for traffic", "node", s.NodeName)
	default:
		s.Logger.Info("the node is not eligible for traffic: /healthz answers 503", "node", s.NodeName, "reason", why)
	}
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

func (s *Source) sliceKey(obj any) (string, bool) {
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

// update re-translates the service with key "namespace/name" and upserts
// or deletes it; trigger is when the change behind it was made, if known.
func (s *Source) update(key string, trigger time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
	var slices []*discoveryv1.EndpointSlice
	for _, o := range objs {
		slices = append(slices, o.(*discoveryv1.EndpointSlice))
	}
	t, err := Translate(svc, slices)
	if errors.Is(err, ErrSkipped) {
		s.Logger.Debug("skipping service", "service", key, "reason", err)
		s.delete(key)
		return
	}
	if err == nil {
		err = s.dst.UpsertTriggered(trigger, t)
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

// reportOnce reports an invalid service, once per distinct error, so that
// unrelated slice updates do not repeat it.
func (s *Source) reportOnce(key string, err error) {
	if s.invalid[key] == err.Error() {
		return
	}
	s.invalid[key] = err.Error()
	s.report(key, err)
}
