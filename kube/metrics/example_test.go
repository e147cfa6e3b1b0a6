package metrics_test

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kproxy-dev/kproxy/kube/metrics"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// A Runner whose syncs kube-proxy's dashboards can read: the metrics are
// fed by the Runner's hooks and served on kube-proxy's metrics address.
func Example() {
	reg := prometheus.NewRegistry()
	var runner *servicelb.Runner
	m := metrics.NewKubeProxy(reg, func() servicelb.Health { return runner.Health() })
	runner, err := servicelb.NewRunner(&fake.Proxier{}, servicelb.RunnerOptions{Hooks: m.Hooks()})
	if err != nil {
		panic(err)
	}
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	go func() { _ = http.ListenAndServe("127.0.0.1:10249", nil) }()
	_ = runner // runner.Run(ctx), fed by a kube.Source
}
