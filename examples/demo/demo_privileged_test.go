//go:build privileged || vm

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
)

// rows returns the count rows of each traffic table in the output, by
// backend name.
func rows(out string) []map[string][2]int {
	var tables []map[string][2]int
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "answered by") {
			tables = append(tables, map[string][2]int{})
			continue
		}
		var name string
		var a, b int
		if n, _ := fmt.Sscanf(line, "  %s %d %d", &name, &a, &b); n == 3 && len(tables) > 0 {
			tables[len(tables)-1][name] = [2]int{a, b}
		}
	}
	return tables
}

// The demo, as `make test` runs it: traffic spread over three backends on
// the ClusterIP and the NodePort, the rules listed, one backend removed and
// the traffic shifted, everything torn down.
func TestDemo(t *testing.T) {
	testutil.RequireRoot(t)
	for _, backend := range append([]string{"nftables", "iptables", "ebpf", "userspace"}, vmBackends...) {
		t.Run(backend, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out, errOut bytes.Buffer
			code := run(ctx, []string{"--backend", backend, "--requests", "150"}, &out, &errOut)
			t.Logf("output:\n%s%s", out.String(), errOut.String())
			if strings.Contains(errOut.String(), "not available in this build") {
				testutil.SkipOrFail(t, errOut.String())
			}
			if code != 0 {
				t.Fatalf("exit %d", code)
			}
			tables := rows(out.String())
			if len(tables) != 2 {
				t.Fatalf("%d traffic tables, want 2", len(tables))
			}
			for i := 1; i <= 3; i++ {
				name := fmt.Sprintf("backend-%d", i)
				if c := tables[0][name]; c[0] < 20 || c[1] < 20 {
					t.Errorf("before: %s answered %v of 150, want a fair share on both addresses", name, c)
				}
			}
			for i, tab := range tables {
				if c := tab["error"]; c != [2]int{0, 0} {
					t.Errorf("table %d: %v requests failed, want none", i+1, c)
				}
			}
			if c := tables[1]["backend-2"]; c != [2]int{0, 0} {
				t.Errorf("after removing backend-2 it still answered %v", c)
			}
			if c1, c3 := tables[1]["backend-1"], tables[1]["backend-3"]; c1[0]+c3[0] != 150 || c1[1]+c3[1] != 150 {
				t.Errorf("after: backend-1 %v and backend-3 %v, want all 150 between them", c1, c3)
			}
			for _, want := range []string{"Programmed with the " + backend + " backend", "10.100.1.2", "Tearing down: rules, servers and namespaces ... done."} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q", want)
				}
			}
			if backend == "ebpf" {
				checkSocketTraffic(t, out.String())
			}
			left, _ := filepath.Glob(fmt.Sprintf("/run/netns/%s%d-*", sandbox.Prefix, os.Getpid()))
			if len(left) > 0 {
				t.Errorf("namespaces left behind: %v", left)
			}
		})
	}
}

// checkSocketTraffic: the node's own requests, balanced by the socket
// hooks, all reached a backend, each backend some; the demo's cgroup and
// mounts are gone.
func checkSocketTraffic(t *testing.T, out string) {
	t.Helper()
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "from the node's own sockets") {
			line = l
		}
	}
	if line == "" || strings.Contains(line, "error") {
		t.Errorf("node traffic: %q, want every request answered", line)
	}
	for i := 1; i <= 3; i++ {
		if strings.Contains(line, fmt.Sprintf("backend-%d 0", i)) {
			t.Errorf("node traffic: %q, want backend-%d to answer some", line, i)
		}
	}
	left, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("kproxy-demo-%d-*", os.Getpid())))
	if len(left) > 0 {
		t.Errorf("mounts left behind: %v", left)
	}
}
