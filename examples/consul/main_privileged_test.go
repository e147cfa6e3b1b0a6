//go:build privileged

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kproxy-dev/kproxy/examples/internal/testservers"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
)

// The binary, run against a real Consul agent with a mapping file, prints
// the rules for the services it maps.
func TestDryRunAgainstConsul(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	agent, err := testservers.StartConsul(ctx)
	if err != nil {
		testutil.SkipOrFail(t, "consul: "+err.Error())
	}
	defer agent.Stop()
	c, err := api.NewClient(&api.Config{Address: agent.Addr})
	if err != nil {
		t.Fatal(err)
	}
	for id, addr := range map[string]string{"web-1": "10.100.1.2", "web-2": "10.100.2.2"} {
		if err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: id, Name: "web", Address: addr, Port: 8080}); err != nil {
			t.Fatal(err)
		}
	}
	mapping := filepath.Join(t.TempDir(), "mapping.yaml")
	if err := os.WriteFile(mapping, []byte("services:\n  web: {vip: 10.96.0.20, port: 80}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := program().Run(ctx, []string{"--consul-addr", agent.Addr, "--mapping", mapping, "--backend", "iptables", "--dry-run", "--once"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"-d 10.96.0.20/32", "--to-destination 10.100.1.2:8080", "--to-destination 10.100.2.2:8080"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
