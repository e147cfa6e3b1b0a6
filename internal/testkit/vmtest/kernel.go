//go:build linux

package vmtest

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// KernelMeta is the Debian package that provides the guest kernel.
const KernelMeta = "linux-image-cloud-amd64"

// Kernel is an unpacked kernel package in the cache.
type Kernel struct {
	Package string // versioned package name, e.g. linux-image-6.1.0-56-cloud-amd64
	Version string // package version, e.g. 6.1.192-2
	Release string // kernel release (uname -r), e.g. 6.1.0-56-cloud-amd64
	Root    string // where the package is unpacked (dpkg -x)
}

// Vmlinuz is the kernel image.
func (k *Kernel) Vmlinuz() string {
	return filepath.Join(k.Root, "boot", "vmlinuz-"+k.Release)
}

// ModulesDir is the depmod'ed module tree.
func (k *Kernel) ModulesDir() string {
	return filepath.Join(k.Root, "lib", "modules", k.Release)
}

// ParseDepends returns the first package named like prefix* in the output
// of `apt-cache depends`.
func ParseDepends(out, prefix string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		field, name, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		name = strings.TrimSpace(name)
		if ok && strings.TrimPrefix(field, "|") == "Depends" && strings.HasPrefix(name, prefix) {
			return name
		}
	}
	return ""
}

// ParseVersion returns the Version field of `apt-cache show` output.
func ParseVersion(out string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Version: "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// KernelCache fetches and unpacks the guest kernel into Dir, one
// directory per package and version, and reuses what is there.
type KernelCache struct {
	Dir string
	Log *slog.Logger // nil discards
}

func (c *KernelCache) log() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}

// Ensure returns the kernel that KernelMeta currently depends on, from the
// cache or freshly downloaded (apt-get download), unpacked (dpkg -x) and
// indexed (depmod -b). When apt cannot resolve the package (offline, no
// package lists) the newest cached kernel is used instead.
func (c *KernelCache) Ensure(ctx context.Context) (*Kernel, error) {
	pkg, ver, err := c.resolve(ctx)
	if err != nil {
		if k := c.newestCached(); k != nil {
			c.log().Warn("cannot resolve the kernel package; using the cached one", "err", err, "kernel", k.Release)
			return k, nil
		}
		return nil, err
	}
	dir := filepath.Join(c.Dir, pkg+"_"+ver)
	if k, err := loadKernel(dir, pkg, ver); err == nil {
		return k, nil
	}
	c.log().Info("fetching kernel", "package", pkg, "version", ver)
	k, err := c.fetch(ctx, dir, pkg, ver)
	if err != nil {
		return nil, err
	}
	c.prune(filepath.Base(dir))
	return k, nil
}

// prune removes the cached kernels other than keep (about 100 MB each).
func (c *KernelCache) prune(keep string) {
	ents, _ := os.ReadDir(c.Dir)
	for _, e := range ents {
		if e.Name() != keep && strings.HasPrefix(e.Name(), "linux-image-") {
			c.log().Info("removing an older cached kernel", "dir", e.Name())
			_ = os.RemoveAll(filepath.Join(c.Dir, e.Name()))
		}
	}
}

func (c *KernelCache) resolve(ctx context.Context) (pkg, ver string, err error) {
	for attempt := 0; ; attempt++ {
		out, _ := exec.CommandContext(ctx, "apt-cache", "depends", KernelMeta).CombinedOutput()
		pkg = ParseDepends(string(out), "linux-image-")
		if pkg != "" {
			break
		}
		if attempt > 0 || os.Getuid() != 0 {
			return "", "", fmt.Errorf("resolve %s: apt-cache knows no such package (run apt-get update): %s", KernelMeta, strings.TrimSpace(string(out)))
		}
		c.log().Info("apt-get update: the package lists do not know " + KernelMeta)
		if out, err := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("apt-get update: %w: %s", err, out)
		}
	}
	out, err := exec.CommandContext(ctx, "apt-cache", "show", "--no-all-versions", pkg).CombinedOutput()
	if ver = ParseVersion(string(out)); err != nil || ver == "" {
		return "", "", fmt.Errorf("resolve %s: no version: %v: %s", pkg, err, out)
	}
	return pkg, ver, nil
}

func (c *KernelCache) fetch(ctx context.Context, dir, pkg, ver string) (*Kernel, error) {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return nil, err
	}
	// apt drops privileges to _apt for downloads: let it write here.
	if err := os.MkdirAll(tmp, 0o777); err != nil {
		return nil, err
	}
	_ = os.Chmod(tmp, 0o777)
	run := func(name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("apt-get", "download", "-q", pkg+"="+ver); err != nil {
		return nil, err
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("apt-get download %s: expected one .deb, found %d", pkg, len(debs))
	}
	if err := run("dpkg", "-x", debs[0], "root"); err != nil {
		return nil, err
	}
	rel, err := onlyRelease(filepath.Join(tmp, "root", "lib", "modules"))
	if err != nil {
		return nil, err
	}
	if err := run("depmod", "-b", "root", rel); err != nil {
		return nil, err
	}
	if err := os.Remove(debs[0]); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "release"), []byte(rel+"\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	return loadKernel(dir, pkg, ver)
}

func onlyRelease(modules string) (string, error) {
	ents, err := os.ReadDir(modules)
	if err != nil {
		return "", fmt.Errorf("unpacked kernel: %w", err)
	}
	if len(ents) != 1 {
		return "", fmt.Errorf("unpacked kernel: %d releases in %s, want 1", len(ents), modules)
	}
	return ents[0].Name(), nil
}

// loadKernel reads a complete cache directory: the release file is
// written last, so its presence means the unpacking finished.
func loadKernel(dir, pkg, ver string) (*Kernel, error) {
	b, err := os.ReadFile(filepath.Join(dir, "release"))
	if err != nil {
		return nil, err
	}
	k := &Kernel{Package: pkg, Version: ver, Release: strings.TrimSpace(string(b)), Root: filepath.Join(dir, "root")}
	for _, p := range []string{k.Vmlinuz(), filepath.Join(k.ModulesDir(), "modules.dep")} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("cached kernel %s: %w", dir, err)
		}
	}
	return k, nil
}

func (c *KernelCache) newestCached() *Kernel {
	ents, err := os.ReadDir(c.Dir)
	if err != nil {
		return nil
	}
	var best *Kernel
	var bestTime int64
	for _, e := range ents {
		pkg, ver, ok := strings.Cut(e.Name(), "_")
		if !ok || !strings.HasPrefix(pkg, "linux-image-") || strings.HasSuffix(ver, ".tmp") {
			continue
		}
		k, err := loadKernel(filepath.Join(c.Dir, e.Name()), pkg, ver)
		if err != nil {
			continue
		}
		if fi, err := os.Stat(filepath.Join(c.Dir, e.Name(), "release")); err == nil && fi.ModTime().UnixNano() > bestTime {
			best, bestTime = k, fi.ModTime().UnixNano()
		}
	}
	return best
}
