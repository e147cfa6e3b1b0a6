//go:build linux

package vmtest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakeKernel writes a cache directory that loadKernel accepts.
func fakeKernel(t *testing.T, cache, name, release string, complete bool, age time.Duration) {
	t.Helper()
	root := filepath.Join(cache, name, "root")
	for p, content := range map[string]string{
		"boot/vmlinuz-" + release:                 "kernel",
		"lib/modules/" + release + "/modules.dep": "kernel/drivers/net/dummy.ko:\n",
	} {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if complete {
		rel := filepath.Join(cache, name, "release")
		if err := os.WriteFile(rel, []byte(release+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		when := time.Now().Add(-age)
		if err := os.Chtimes(rel, when, when); err != nil {
			t.Fatal(err)
		}
	}
}

func TestKernelCacheOffline(t *testing.T) {
	cache := t.TempDir()
	fakeKernel(t, cache, "linux-image-6.1.0-1-cloud-amd64_6.1.1-1", "6.1.0-1-cloud-amd64", true, time.Hour)
	fakeKernel(t, cache, "linux-image-6.1.0-2-cloud-amd64_6.1.2-1", "6.1.0-2-cloud-amd64", true, time.Minute)
	fakeKernel(t, cache, "linux-image-6.1.0-3-cloud-amd64_6.1.3-1.tmp", "6.1.0-3-cloud-amd64", true, 0)
	fakeKernel(t, cache, "linux-image-6.1.0-4-cloud-amd64_6.1.4-1", "6.1.0-4-cloud-amd64", false, 0)
	c := &KernelCache{Dir: cache}
	k := c.newestCached()
	if k == nil || k.Release != "6.1.0-2-cloud-amd64" || k.Package != "linux-image-6.1.0-2-cloud-amd64" || k.Version != "6.1.2-1" {
		t.Fatalf("newestCached = %+v, want the newest complete kernel 6.1.0-2", k)
	}
	if _, err := os.Stat(k.Vmlinuz()); err != nil {
		t.Error(err)
	}
	c.prune("linux-image-6.1.0-2-cloud-amd64_6.1.2-1")
	ents, _ := os.ReadDir(cache)
	if len(ents) != 1 || ents[0].Name() != "linux-image-6.1.0-2-cloud-amd64_6.1.2-1" {
		t.Errorf("after prune: %v", ents)
	}
}

func TestCachedSegment(t *testing.T) {
	c := &Config{CacheDir: t.TempDir()}
	if err := c.defaults(); err != nil {
		t.Fatal(err)
	}
	l := NewListing("/")
	l.AddData("etc/a", []byte("one"), 0o644)
	p1, err := c.cachedSegment("tools", l)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(p1, old, old); err != nil {
		t.Fatal(err)
	}
	again, err := c.cachedSegment("tools", l)
	if err != nil || again != p1 {
		t.Fatalf("same listing: %s, %v; want %s", again, err, p1)
	}
	if fi, _ := os.Stat(p1); !fi.ModTime().Equal(old) {
		t.Error("an unchanged segment was written again")
	}
	l.AddData("etc/a", []byte("two"), 0o644)
	p2, err := c.cachedSegment("tools", l)
	if err != nil || p2 == p1 {
		t.Fatalf("changed listing: %s, %v", p2, err)
	}
	if _, err := os.Stat(p1); !os.IsNotExist(err) {
		t.Error("the outdated segment was kept")
	}
	f, err := os.Open(p2)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries, err := ReadCPIO(f)
	if err != nil {
		t.Fatal(err)
	}
	var data string
	for _, e := range entries {
		if e.Path == "etc/a" {
			data = string(e.Data)
		}
	}
	if data != "two" {
		t.Errorf("segment holds etc/a = %q, want two", data)
	}
}
