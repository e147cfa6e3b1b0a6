//go:build linux

package vmtest

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeRoot builds a small merged-/usr host tree:
//
//	/lib -> usr/lib, /bin -> usr/bin, /sbin -> usr/sbin, /lib64 -> usr/lib64
//	/usr/lib64/ld.so -> /lib/x86_64/ld-real.so
//	/usr/sbin/iptables -> /etc/alternatives/iptables -> /usr/sbin/iptables-nft
//	/usr/sbin/iptables-nft -> xtables-nft-multi
//	/usr/lib/x86_64/xtables/{libxt_a.so, libxt_b.so -> libxt_a.so}
func fakeRoot(t *testing.T) string {
	root := t.TempDir()
	mk := func(p, content string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(p, target string) {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
	mk("usr/lib/x86_64/ld-real.so", "ld")
	mk("usr/sbin/xtables-nft-multi", "multi")
	mk("usr/lib/x86_64/xtables/libxt_a.so", "a")
	mk("usr/bin/placeholder", "")
	link("usr/lib/x86_64/xtables/libxt_b.so", "libxt_a.so")
	link("lib", "usr/lib")
	link("bin", "usr/bin")
	link("sbin", "usr/sbin")
	link("lib64", "usr/lib64")
	link("usr/lib64/ld.so", "/lib/x86_64/ld-real.so")
	link("usr/sbin/iptables", "/etc/alternatives/iptables")
	link("etc/alternatives/iptables", "/usr/sbin/iptables-nft")
	link("usr/sbin/iptables-nft", "xtables-nft-multi")
	return root
}

type listed struct {
	Path, Link string
	Dir        bool
	Source     string
}

func listing(l *Listing, root string) []listed {
	var out []listed
	for _, e := range l.Entries() {
		src, _ := filepath.Rel(root, e.Source)
		if e.Source == "" {
			src = ""
		}
		out = append(out, listed{Path: e.Path, Link: e.Link, Dir: e.Mode.IsDir(), Source: src})
	}
	return out
}

func TestListingAddHost(t *testing.T) {
	root := fakeRoot(t)
	l := NewListing(root)
	var files []string
	for _, p := range []string{"/lib64/ld.so", "/sbin/iptables", "/lib/x86_64/xtables"} {
		got, err := l.AddHost(p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, got...)
	}
	want := []listed{
		{Path: "bin", Link: "usr/bin"},
		{Path: "etc", Dir: true},
		{Path: "etc/alternatives", Dir: true},
		{Path: "etc/alternatives/iptables", Link: "/usr/sbin/iptables-nft"},
		{Path: "lib", Link: "usr/lib"},
		{Path: "lib64", Link: "usr/lib64"},
		{Path: "sbin", Link: "usr/sbin"},
		{Path: "usr", Dir: true},
		{Path: "usr/lib", Dir: true},
		{Path: "usr/lib/x86_64", Dir: true},
		{Path: "usr/lib/x86_64/ld-real.so", Source: "usr/lib/x86_64/ld-real.so"},
		{Path: "usr/lib/x86_64/xtables", Dir: true},
		{Path: "usr/lib/x86_64/xtables/libxt_a.so", Source: "usr/lib/x86_64/xtables/libxt_a.so"},
		{Path: "usr/lib/x86_64/xtables/libxt_b.so", Link: "/usr/lib/x86_64/xtables/libxt_a.so"},
		{Path: "usr/lib64", Dir: true},
		{Path: "usr/lib64/ld.so", Link: "/usr/lib/x86_64/ld-real.so"},
		{Path: "usr/sbin", Dir: true},
		{Path: "usr/sbin/iptables", Link: "/etc/alternatives/iptables"},
		{Path: "usr/sbin/iptables-nft", Link: "/usr/sbin/xtables-nft-multi"},
		{Path: "usr/sbin/xtables-nft-multi", Source: "usr/sbin/xtables-nft-multi"},
	}
	if diff := cmp.Diff(want, listing(l, root)); diff != "" {
		t.Errorf("listing (-want +got):\n%s", diff)
	}
	wantFiles := []string{"/usr/lib/x86_64/ld-real.so", "/usr/sbin/xtables-nft-multi",
		"/usr/lib/x86_64/xtables/libxt_a.so", "/usr/lib/x86_64/xtables/libxt_a.so"}
	if diff := cmp.Diff(wantFiles, files); diff != "" {
		t.Errorf("files for ldd (-want +got):\n%s", diff)
	}
}

func TestListingErrors(t *testing.T) {
	root := fakeRoot(t)
	if err := os.Symlink("loop", filepath.Join(root, "loop")); err != nil {
		t.Fatal(err)
	}
	l := NewListing(root)
	for _, p := range []string{"/missing", "/loop"} {
		if _, err := l.AddHost(p); err == nil {
			t.Errorf("AddHost(%s): no error", p)
		}
	}
}

func TestListingKey(t *testing.T) {
	root := fakeRoot(t)
	build := func() string {
		l := NewListing(root)
		if _, err := l.AddHost("/sbin/iptables"); err != nil {
			t.Fatal(err)
		}
		l.AddData("init", []byte("#!/bin/sh"), 0o755)
		k, err := l.Key()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k1 := build()
	if k2 := build(); k1 != k2 {
		t.Fatalf("same content, different keys %s %s", k1, k2)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/xtables-nft-multi"), []byte("upgraded"), 0o755); err != nil {
		t.Fatal(err)
	}
	if k3 := build(); k3 == k1 {
		t.Fatal("key did not change when a host file changed")
	}
}

func TestGuestPath(t *testing.T) {
	for in, want := range map[string]string{
		"/lib/x/libc.so": "usr/lib/x/libc.so",
		"/bin/kmod":      "usr/bin/kmod",
		"/usr/sbin/nft":  "usr/sbin/nft",
		"/etc/protocols": "etc/protocols",
		"/library/x":     "library/x",
	} {
		if got := guestPath(in); got != want {
			t.Errorf("guestPath(%s) = %s, want %s", in, got, want)
		}
	}
	l := NewListing("/")
	l.AddFile("/vmtest/bin/x.test", "/nonexistent", 0o755|fs.ModeSetuid)
	if e := l.Entries(); e[len(e)-1].Mode != 0o755 {
		t.Errorf("mode not reduced to permission bits: %v", e[len(e)-1].Mode)
	}
}

// TestHostTools builds the real tools listing from this machine, the way
// the runner does, and checks that the programs find their interpreter,
// libraries and iptables extensions in it.
func TestHostTools(t *testing.T) {
	if _, err := LookTool("nft"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("oracle tools missing under CI: %v", err)
		}
		t.Skipf("oracle tools not installed (make deps): %v", err)
	}
	cache := filepath.Join(t.TempDir(), "ldd.json")
	l := NewListing("/")
	if err := AddTools(t.Context(), l, DefaultTools, DefaultDataPaths, cache); err != nil {
		t.Fatal(err)
	}
	key, err := l.Key()
	if err != nil {
		t.Fatal(err)
	}
	again := NewListing("/")
	if err := AddTools(t.Context(), again, DefaultTools, DefaultDataPaths, cache); err != nil {
		t.Fatal(err)
	}
	if key2, _ := again.Key(); key2 != key {
		t.Errorf("listing with cached ldd answers differs: key %s, first %s", key2, key)
	}
	for _, p := range []string{
		"usr/bin/busybox", "usr/sbin/nft", "usr/sbin/ipset", "usr/sbin/ipvsadm", "usr/sbin/conntrack",
		"usr/sbin/iptables-nft-save", "usr/sbin/xtables-nft-multi", "usr/sbin/modprobe", "usr/bin/setpriv",
		"usr/lib/x86_64-linux-gnu/libnftables.so.1", "usr/lib/x86_64-linux-gnu/libc.so.6",
		"usr/lib/x86_64-linux-gnu/xtables/libxt_statistic.so", "usr/lib64/ld-linux-x86-64.so.2",
		"etc/protocols", "lib", "lib64",
	} {
		if !l.Has(p) {
			t.Errorf("tools listing lacks %s", p)
		}
	}
}
