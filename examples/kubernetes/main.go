// Command kubernetes is a node agent that load-balances a Kubernetes
// cluster's Services as kube-proxy does, fed by client-go informers on
// Services and EndpointSlices: endpoint conditions (ready, serving,
// terminating), node names and topology hints decide the backends;
// headless and ExternalName services are skipped; the
// service.kubernetes.io/service-proxy-name label selects the services this
// proxy handles (--proxy-name).
//
// It needs a kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) or the
// in-cluster configuration, read access to Services and EndpointSlices
// (and to its Node under --detect-local-mode=NodeCIDR without
// --node-cidrs: it reads the Node's spec.podCIDRs), and root
// (CAP_NET_ADMIN) with the chosen backend's kernel support unless
// --dry-run:
//
//	go run ./examples/kubernetes --kubeconfig ~/.kube/config --node-name $(hostname) --node-ips 192.0.2.10 --dry-run
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"

	"k8s.io/client-go/kubernetes"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/kubesource"
)

func main() { agent.Main(program()) }

// program is the agent: its flags, its source, and the pod CIDRs of its
// Node for --detect-local-mode=NodeCIDR.
func program() agent.Program {
	var kubeconfig, proxyName string
	var client kubernetes.Interface
	connect := func() (kubernetes.Interface, error) {
		if client != nil {
			return client, nil
		}
		cfg, err := kubesource.RestConfig(kubeconfig)
		if err != nil {
			return nil, err
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		client = c
		return c, nil
	}
	return agent.Program{
		Name: "kubernetes",
		Usage: "kubernetes: a node agent that load-balances Kubernetes Services from their\n" +
			"EndpointSlices, like kube-proxy. Needs root unless --dry-run.",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config, else $KUBECONFIG or ~/.kube/config)")
			fs.StringVar(&proxyName, "proxy-name", "", "handle only services labelled "+kubesource.LabelProxyName+"=NAME (default: only services without the label)")
		},
		Sources: func(log *slog.Logger) ([]agent.Source, error) {
			c, err := connect()
			if err != nil {
				return nil, err
			}
			return []agent.Source{&kubesource.Source{Client: c, ProxyName: proxyName, Logger: log}}, nil
		},
		NodeCIDRs: func(ctx context.Context, node string) ([]netip.Prefix, error) {
			c, err := connect()
			if err != nil {
				return nil, err
			}
			return kubesource.NodeCIDRs(ctx, c, node)
		},
	}
}
