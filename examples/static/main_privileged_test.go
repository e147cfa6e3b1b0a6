//go:build privileged

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// The binary prints the rules for the example file.
func TestDryRunExampleFile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code := program().Run(ctx, []string{"--file", "services.yaml", "--backend", "iptables", "--dry-run", "--once", "--node-ips", "10.100.0.1"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"-d 10.96.0.10/32", "-d 10.96.0.11/32", "--dport 30080", "--to-destination 10.100.3.2:8080"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
