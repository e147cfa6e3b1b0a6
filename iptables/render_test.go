//go:build linux

package iptables

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got):\n%s", path, diff)
	}
}

func newOffline(t testing.TB, o Options) *Proxier {
	t.Helper()
	o.conn, o.NoConntrackCleanup = offlineConn{}, true
	px, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return px
}

func TestRenderGolden(t *testing.T) {
	st := richState(t)
	for _, tc := range []struct {
		file   string
		prefix string
	}{
		{"rich-kproxy.golden", ""},
		{"rich-kube.golden", "KUBE-"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			px := newOffline(t, Options{ChainPrefix: tc.prefix})
			got, err := px.Render(st)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, got)
		})
	}
	for name, st := range detectStates(t) {
		t.Run(name, func(t *testing.T) {
			got, err := newOffline(t, Options{}).Render(st)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, name+".golden", got)
		})
	}
}
