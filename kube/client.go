package kube

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ClientOptions are kube-proxy's client connection settings
// (clientConnection of its configuration, --kubeconfig and --master).
type ClientOptions struct {
	// Kubeconfig names a kubeconfig file; empty means the in-cluster
	// configuration when running in a pod, else the default kubeconfig
	// ($KUBECONFIG or ~/.kube/config).
	Kubeconfig string
	// Master overrides the kubeconfig's API server address.
	Master string
	// QPS and Burst bound the requests to the API server; zero keeps
	// client-go's (5 and 10, kube-proxy's defaults).
	QPS   float32
	Burst int
	// ContentType is the content type of requests, such as
	// application/vnd.kubernetes.protobuf (kube-proxy's default); empty
	// keeps client-go's (JSON).
	ContentType string
	// UserAgent names the client to the API server; empty keeps
	// client-go's.
	UserAgent string
}

// RestConfig returns the client configuration of the options.
func RestConfig(o ClientOptions) (*rest.Config, error) {
	var c *rest.Config
	var err error
	switch {
	case o.Kubeconfig != "" || o.Master != "":
		c, err = clientcmd.BuildConfigFromFlags(o.Master, o.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %q: %w", o.Kubeconfig, err)
		}
	default:
		if c, err = rest.InClusterConfig(); err != nil {
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			c, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
			if err != nil {
				return nil, fmt.Errorf("no in-cluster config and no kubeconfig (name one): %w", err)
			}
		}
	}
	if o.QPS != 0 {
		c.QPS = o.QPS
	}
	if o.Burst != 0 {
		c.Burst = o.Burst
	}
	if o.ContentType != "" {
		c.ContentType = o.ContentType
	}
	if o.UserAgent != "" {
		c.UserAgent = o.UserAgent
	}
	return c, nil
}

// NewClient returns a client of the options.
func NewClient(o ClientOptions) (kubernetes.Interface, error) {
	c, err := RestConfig(o)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, nil
}
