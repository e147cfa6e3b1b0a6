package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// --dry-run prints the rules for the bundled services and needs nothing.
func TestDryRun(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"--backend", "iptables", "--dry-run"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{
		"# iptables dry run, sync 1: 1 services",
		`-A KPROXY-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "demo/web:http cluster IP" -m tcp --dport 80`,
		"--to-destination 10.100.3.2:8080",
		"--dport 30080",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run lacks %q", want)
		}
	}
}

func TestBadFlags(t *testing.T) {
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"--backend", "bogus", "--dry-run"}, &bytes.Buffer{}, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), `--backend "bogus": want one of ebpf, iptables, ipvs, nftables, userspace`) {
		t.Errorf("bad backend: exit %d, %q", code, errOut.String())
	}
	if code := run(context.Background(), []string{"--services", "/nonexistent.yaml", "--dry-run"}, &bytes.Buffer{}, &bytes.Buffer{}); code != 1 {
		t.Errorf("missing services file: exit %d, want 1", code)
	}
}
