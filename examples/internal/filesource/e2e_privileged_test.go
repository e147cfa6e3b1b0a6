//go:build privileged || vm

package filesource

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/examples/internal/e2e"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
)

func TestFileFake(t *testing.T) {
	fileScenario(t, func(src *Source) *e2e.World { return e2e.StartFake(t, src) })
}

func TestFilePackets(t *testing.T) {
	for _, backend := range append([]string{"nftables", "iptables"}, vmBackends...) {
		t.Run(backend, func(t *testing.T) {
			fileScenario(t, func(src *Source) *e2e.World { return e2e.StartPackets(t, backend, src) })
		})
	}
}

// webFile returns a file with service web on the given backends, and a
// service other on backend 3 whose node port is extra.
func webFile(otherNodePort int, backends ...int) string {
	var b strings.Builder
	b.WriteString("services:\n  - name: web\n    clusterIPs: [10.96.0.10]\n")
	b.WriteString("    ports: [{name: http, port: 80, nodePort: 30080, targetPort: 8080}]\n    endpoints:\n")
	for _, i := range backends {
		fmt.Fprintf(&b, "      - addr: %s\n", sandbox.BackendAddr(i))
	}
	fmt.Fprintf(&b, "  - name: other\n    clusterIPs: [10.96.0.11]\n    ports: [{port: 80, targetPort: 8080, nodePort: %d}]\n", otherNodePort)
	fmt.Fprintf(&b, "    endpoints: [{addr: %s}]\n", sandbox.BackendAddr(3))
	return b.String()
}

func fileScenario(t *testing.T, start func(*Source) *e2e.World) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path+".tmp", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write(webFile(30081, 1, 2, 3))
	w := start(&Source{Path: path})
	web := e2e.Target{Service: "web", URL: "http://10.96.0.10:80/"}
	other := e2e.Target{Service: "other", URL: "http://10.96.0.11:80/"}
	w.Expect(t, 10*time.Second, web, 1, 2, 3)
	w.Expect(t, 2*time.Second, e2e.Target{Service: "web", URL: fmt.Sprintf("http://%s:30080/", sandbox.NodeAddr)}, 1, 2, 3)
	w.Expect(t, 2*time.Second, other, 3)

	t.Log("edit: backend 2 removed")
	write(webFile(30081, 1, 3))
	w.Expect(t, 2*time.Second, web, 1, 3)

	t.Log("invalid edit of other (node port out of range) while web changes")
	write(webFile(80, 2))
	w.WaitReport(t, 2*time.Second, "other", `services.yaml:9: service "other": ports[0].nodePort: 80: node port outside the node port range`)
	w.Expect(t, 2*time.Second, web, 2)
	w.Expect(t, 2*time.Second, other, 3)

	t.Log("broken file: the last good state stays")
	write("services: [\n")
	w.WaitReport(t, 2*time.Second, path, "keeping the last good state")
	w.Expect(t, 2*time.Second, web, 2)

	t.Log("web removed from the file")
	write("services:\n  - name: other\n    clusterIPs: [10.96.0.11]\n    ports: [{port: 80, targetPort: 8080}]\n    endpoints: [{addr: 10.100.1.2}]\n")
	w.Expect(t, 2*time.Second, web)
	w.Expect(t, 2*time.Second, other, 1)
}
