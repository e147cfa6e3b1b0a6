package healthcheck_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"

	"github.com/kproxy-dev/kproxy/healthcheck"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// Services follow a Runner through Hooks.Applied: here a load balancer's
// probe of a service's health check node port finds the service's
// endpoint on this node. A real agent passes a backend instead of the fake
// proxier, the node's namespace and node-port addresses (here loopback, on
// a free port), and also serves the proxy's health (Proxy.Run).
func ExampleServices() {
	port := freePort()
	node := servicelb.NodeConfig{NodeName: "node-a", NodePortRange: servicelb.PortRange{Min: 1024, Max: 65535}}
	var hc *healthcheck.Services
	synced := make(chan error, 1)
	p := &fake.Proxier{}
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{
		Node:  node,
		Hooks: servicelb.Hooks{Applied: func(st *servicelb.State) { synced <- hc.Sync(st) }},
	})
	if err != nil {
		panic(err)
	}
	proxy, err := healthcheck.NewProxy(healthcheck.ProxyOptions{Health: r.Health})
	if err != nil {
		panic(err)
	}
	hc = healthcheck.NewServices(healthcheck.ServicesOptions{
		Addrs:        []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		ProxyHealthy: proxy.Live,
	})
	defer hc.Close()

	src := r.Source("file")
	err = src.Upsert(servicelb.Service{
		Name:                  "default/web",
		LoadBalancerIPs:       []netip.Addr{netip.MustParseAddr("203.0.113.10")},
		Ports:                 []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080}},
		ExternalTrafficPolicy: servicelb.PolicyLocal,
		HealthCheckNodePort:   port,
		Endpoints:             []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.244.1.2"), NodeName: "node-a"}},
	})
	if err != nil {
		panic(err)
	}
	src.Synced()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	if err := <-synced; err != nil {
		panic(err)
	}

	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.Status)
	fmt.Println(string(body))
	cancel()
	<-done
	// Output:
	// 200 OK
	// {
	// 	"service": {
	// 		"namespace": "default",
	// 		"name": "web"
	// 	},
	// 	"localEndpoints": 1,
	// 	"serviceProxyHealthy": true
	// }
}

// freePort returns a TCP port free on loopback.
func freePort() uint16 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}
