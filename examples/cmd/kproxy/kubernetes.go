package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/kube"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// kubeSource is --source kubernetes.
type kubeSource struct {
	opts   kube.ClientOptions
	qps    float64
	proxy  string
	client kubernetes.Interface
	log    func(msg string, args ...any)
}

func (k *kubeSource) register(fs *flag.FlagSet) []string {
	fs.StringVar(&k.opts.Kubeconfig, "kubeconfig", "", "kubernetes source: kubeconfig file (default: in-cluster config, else $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&k.opts.Master, "master", "", "kubernetes source: the API server's address, overriding the kubeconfig's")
	fs.StringVar(&k.proxy, "proxy-name", "", "kubernetes source: handle only services labelled "+kube.LabelProxyName+"=NAME (default: only services without the label)")
	fs.Float64Var(&k.qps, "kube-api-qps", 0, "kubernetes source: queries per second to the API server (default: client-go's, 5)")
	fs.IntVar(&k.opts.Burst, "kube-api-burst", 0, "kubernetes source: burst of queries to the API server (default: client-go's, 10)")
	fs.StringVar(&k.opts.ContentType, "kube-api-content-type", "", "kubernetes source: content type of requests to the API server, such as application/vnd.kubernetes.protobuf (default: JSON)")
	return []string{"kubeconfig", "master", "proxy-name", "kube-api-qps", "kube-api-burst", "kube-api-content-type"}
}

// restConfig returns the API client's configuration.
func (k *kubeSource) restConfig() (*rest.Config, error) {
	o := k.opts
	o.QPS = float32(k.qps)
	o.UserAgent = "kproxy"
	return kube.RestConfig(o)
}

// connect returns the API client, made once.
func (k *kubeSource) connect() (kubernetes.Interface, error) {
	if k.client != nil {
		return k.client, nil
	}
	cfg, err := k.restConfig()
	if err != nil {
		return nil, err
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	k.client = c
	return c, nil
}

// podCIDRs reads the named Node's pod CIDRs, trying again until it has
// them or ctx ends: an API server not up yet, or a node whose CIDRs the
// node controller has not allocated yet, delays the start rather than
// ending it, with a warning every half minute.
func (k *kubeSource) podCIDRs(ctx context.Context, node string) ([]netip.Prefix, error) {
	c, err := k.connect()
	if err != nil {
		return nil, err
	}
	warned := time.Time{}
	// Listed by name, as the Source watches it: the ClusterRole grants
	// list and watch on nodes, not get.
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()}
	for {
		list, err := c.CoreV1().Nodes().List(ctx, opts)
		var why any = err
		if err == nil {
			why = "no Node of this name yet"
			for i := range list.Items {
				if list.Items[i].Name != node {
					continue
				}
				if cidrs := kube.NodeOf(&list.Items[i]).PodCIDRs; len(cidrs) > 0 {
					return cidrs, nil
				}
				why = "the Node has no pod CIDRs yet"
			}
		}
		if time.Since(warned) >= kube.DefaultNodeWait && k.log != nil {
			k.log("waiting for the node's pod CIDRs (detect-local-mode NodeCIDR)", "node", node, "why", why)
			warned = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func (k *kubeSource) start(s agent.Setup) (agent.Source, error) {
	k.log = s.Logger.Warn
	if s.Config.NodeName == "" {
		// kube-proxy's default: the node is named as the host.
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--node-name not given, and no hostname: %w", err)
		}
		s.Config.NodeName = h
		s.Logger.Info("node name from the hostname", "node", kube.NodeName(h))
	}
	// Node names are lower case: kube-proxy lowers and trims the name it
	// is given, so endpoints of the node match.
	s.Config.NodeName = kube.NodeName(s.Config.NodeName)
	// client-go logs through klog: into kproxy's log, in its format.
	klog.SetSlogLogger(s.Logger)
	c, err := k.connect()
	if err != nil {
		return nil, err
	}
	cfg := s.Config
	return &kubeNode{
		Source: &kube.Source{Client: c, ProxyName: k.proxy, NodeName: cfg.NodeName, Logger: s.Logger},
		ips:    cfg.NodeIPs == "",
		zone:   cfg.Zone == "",
		pods:   cfg.DetectLocalMode == string(servicelb.LocalByNodeCIDR) && cfg.NodeCIDRs == "",
		cidrs:  cfg.ServiceCIDRs == "",
	}, nil
}

// kubeNode is the Kubernetes source, which also follows the Node and the
// ServiceCIDRs into the node config, in what the flags and the
// configuration file leave unsaid: the node's addresses, its zone, its
// pod CIDRs (detect-local-mode NodeCIDR) and the service CIDRs.
type kubeNode struct {
	*kube.Source
	ips, zone, pods, cidrs bool
}

func (k *kubeNode) FollowNode(update func(edit func(*servicelb.NodeConfig))) {
	k.OnNode = func(n kube.Node) {
		update(func(c *servicelb.NodeConfig) {
			if k.ips && len(n.IPs) > 0 {
				c.NodeIPs = n.IPs
			}
			if k.zone {
				c.Zone = n.Zone
			}
			if k.pods && len(n.PodCIDRs) > 0 {
				c.DetectLocal.NodeCIDRs = n.PodCIDRs
			}
		})
	}
	k.OnServiceCIDRs = func(cidrs []netip.Prefix) {
		if k.cidrs && len(cidrs) > 0 {
			update(func(c *servicelb.NodeConfig) { c.ServiceCIDRs = cidrs })
		}
	}
}

var _ agent.NodeFollower = (*kubeNode)(nil)
