// Command kubeproxy-driver drives kube-proxy's own nftables or iptables
// proxier (k8s.io/kubernetes/pkg/proxy, the release go.mod pins) over the
// generated workload, in the network namespace it runs in, for the
// comparison with kproxy (make bench-compare). It speaks the same line
// protocol as kproxy's driver: a JSON line with the workload's digest,
// then one JSON line per command read from standard input (sync, change,
// service, mem, quit). Services and endpoint slices reach the proxier
// through its event handlers before the timed sync, as an informer's
// would; each timed sync is the proxier's own synchronous one.
package main

import (
	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"

	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

func main() {
	backend := flag.String("backend", "nftables", "nftables or iptables")
	n := flag.Int("services", 1000, "services")
	m := flag.Int("endpoints", 10, "endpoints per service")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*backend, *n, *m); err != nil {
		fmt.Fprintln(os.Stderr, "kubeproxy-driver:", err)
		os.Exit(1)
	}
}

func run(backend string, n, m int) error {
	d, err := newDriver(context.Background(), backend, n, m)
	if err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(map[string]any{"digest": d.digest}); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "quit" {
			return nil
		}
		res, err := d.do(f)
		if err != nil {
			res = map[string]any{"error": err.Error()}
		}
		if err := out.Encode(res); err != nil {
			return err
		}
	}
	return in.Err()
}

func (d *driver) do(f []string) (map[string]any, error) {
	arg := func(i, def int) int {
		if len(f) > i {
			if v, err := strconv.Atoi(f[i]); err == nil {
				return v
			}
		}
		return def
	}
	switch f[0] {
	case "sync":
		ms, err := d.coldSync()
		if err != nil {
			return nil, err
		}
		mem, err := benchwork.Memory()
		mem["ms"] = ms
		return mem, err
	case "change":
		s, err := d.changeSamples(arg(1, 100), arg(2, 30000))
		return map[string]any{"ms": s}, err
	case "service":
		add, del, err := d.serviceSamples(arg(1, 10), arg(2, 30000))
		return map[string]any{"add_ms": add, "delete_ms": del}, err
	case "mem":
		runtime.GC()
		debug.FreeOSMemory()
		return benchwork.Memory()
	}
	return nil, fmt.Errorf("unknown command %q", f[0])
}
