//go:build linux

package vmtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Config is one run of the vm tests.
type Config struct {
	ModuleDir string        // root of the Go module whose packages are tested
	CacheDir  string        // kernel and initramfs cache; default <ModuleDir>/.cache/vm
	Patterns  []string      // packages to consider; default ./...
	TestArgs  []string      // flags for every test binary (go test's short names accepted)
	Env       []string      // NAME=value exported in the guest (CI is passed this way)
	Timeout   time.Duration // watchdog for the whole boot; default 60m
	Idle      time.Duration // watchdog for a guest that writes nothing (a hang); default 10m
	MemoryMB  int           // default 2048
	CPUs      int           // default 2
	Shell     bool          // debug shell in the guest after the tests
	Keep      bool          // keep the run directory even when the run passed
	Output    string        // a file the guest's test output is copied to (see saveOutput); empty: none
	Console   io.Writer     // guest console stream; nil discards it
	Log       *slog.Logger  // progress; nil discards it
}

func (c *Config) defaults() error {
	var err error
	if c.ModuleDir, err = filepath.Abs(c.ModuleDir); err != nil {
		return err
	}
	if c.CacheDir == "" {
		c.CacheDir = filepath.Join(c.ModuleDir, ".cache", "vm")
	}
	if len(c.Patterns) == 0 {
		c.Patterns = []string{"./..."}
	}
	if c.Timeout == 0 {
		c.Timeout = 60 * time.Minute
	}
	if c.Idle == 0 {
		c.Idle = 10 * time.Minute
	}
	if c.MemoryMB == 0 {
		c.MemoryMB = 2048
	}
	if c.CPUs == 0 {
		c.CPUs = 2
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	c.CacheDir, err = filepath.Abs(c.CacheDir)
	return err
}

// Run finds the packages with vm tests, compiles them, boots the guest
// with them and returns the parsed report. The error is non-nil when any
// step failed or the report shows a failure (see Report.Err).
func Run(ctx context.Context, c Config) (*Report, error) {
	if err := c.defaults(); err != nil {
		return nil, err
	}
	for _, e := range c.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || !validEnvName(k) {
			return nil, fmt.Errorf("guest environment %q: want NAME=value", e)
		}
	}
	pkgs, err := FindPackages(ctx, c.ModuleDir, c.Patterns)
	if err != nil {
		return nil, err
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("no package in %s has %s-tagged tests", strings.Join(c.Patterns, " "), Tag)
	}
	unlock, err := lockFile(filepath.Join(c.CacheDir, "lock"))
	if err != nil {
		return nil, err
	}
	kc := &KernelCache{Dir: filepath.Join(c.CacheDir, "kernel"), Log: c.Log}
	k, err := kc.Ensure(ctx)
	unlock()
	if err != nil {
		return nil, err
	}
	runDir, err := newRunDir(filepath.Join(c.CacheDir, "runs"))
	if err != nil {
		return nil, err
	}
	rep, err := c.runIn(ctx, k, runDir, pkgs)
	if rep != nil {
		rep.RunDir = runDir
	}
	if err == nil && !c.Keep {
		_ = os.RemoveAll(runDir)
	} else {
		c.Log.Info("run files kept", "dir", runDir)
	}
	return rep, err
}

func (c *Config) runIn(ctx context.Context, k *Kernel, runDir string, pkgs []Package) (*Report, error) {
	start := time.Now()
	if err := compileAll(ctx, c.ModuleDir, filepath.Join(runDir, "bin"), pkgs); err != nil {
		return nil, err
	}
	c.Log.Info("compiled vm tests", "packages", len(pkgs), "took", time.Since(start).Round(time.Millisecond))
	initrd, names, err := c.buildInitrd(ctx, k, runDir, pkgs)
	if err != nil {
		return nil, err
	}
	return c.boot(ctx, k, runDir, initrd, names)
}

// newRunDir makes a fresh directory for one run under dir, so that runs
// started at the same time in one tree do not collide, and removes run
// directories left for more than a day.
func newRunDir(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if old, err := os.ReadDir(dir); err == nil {
		for _, e := range old {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > 24*time.Hour {
				_ = os.RemoveAll(filepath.Join(dir, e.Name()))
			}
		}
	}
	d, err := os.MkdirTemp(dir, "run-")
	if err != nil {
		return "", err
	}
	return d, os.MkdirAll(filepath.Join(d, "bin"), 0o755)
}

// lockFile takes an exclusive lock on path (created if needed), which
// serialises cache updates between runs; unlock releases it.
func lockFile(path string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

func validEnvName(k string) bool {
	for i, r := range k {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return k != ""
}

func compileAll(ctx context.Context, dir, out string, pkgs []Package) error {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	errs := make([]error, len(pkgs))
	for i, p := range pkgs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			cmd := exec.CommandContext(ctx, "go", "test", "-c", "-tags", Tag,
				"-o", filepath.Join(out, p.BinaryName()), p.ImportPath)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if b, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("compile %s: %w\n%s", p.ImportPath, err, b)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// buildInitrd writes the initramfs: the cached tools and modules segments
// (rebuilt only when their content key changes) and a fresh segment with
// the test binaries and /init, concatenated.
func (c *Config) buildInitrd(ctx context.Context, k *Kernel, runDir string, pkgs []Package) (string, []string, error) {
	start := time.Now()
	tools := NewListing("/")
	if err := AddTools(ctx, tools, DefaultTools, DefaultDataPaths, filepath.Join(c.CacheDir, "ldd.json")); err != nil {
		return "", nil, err
	}
	mods := NewListing("/")
	if err := AddModules(mods, k, DefaultModuleSelection); err != nil {
		return "", nil, err
	}
	unlock, err := lockFile(filepath.Join(c.CacheDir, "lock"))
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	var segs []string
	for _, s := range []struct {
		name string
		l    *Listing
	}{{"tools", tools}, {"modules-" + k.Release, mods}} {
		p, err := c.cachedSegment(s.name, s.l)
		if err != nil {
			return "", nil, err
		}
		segs = append(segs, p)
	}
	tests, names, err := c.testsListing(runDir, pkgs)
	if err != nil {
		return "", nil, err
	}
	testsPath := filepath.Join(runDir, "tests.cpio")
	if err := writeSegment(testsPath, tests); err != nil {
		return "", nil, err
	}
	initrd := filepath.Join(runDir, "initrd.cpio")
	if err := concatFiles(initrd, append(segs, testsPath)...); err != nil {
		return "", nil, err
	}
	c.Log.Info("initramfs ready", "path", initrd, "took", time.Since(start).Round(time.Millisecond))
	return initrd, names, nil
}

// testsListing holds the test binaries, their packages' testdata, and
// /init.
func (c *Config) testsListing(runDir string, pkgs []Package) (*Listing, []string, error) {
	l := NewListing("/")
	init := InitConfig{Modules: DefaultModules, Args: TestArgs(c.TestArgs, c.Timeout), Env: c.Env, Shell: c.Shell}
	selected := filtered(c.TestArgs)
	var names []string
	for _, p := range pkgs {
		name := p.BinaryName()
		names = append(names, name)
		l.AddFile("vmtest/bin/"+name, filepath.Join(runDir, "bin", name), 0o755)
		guestDir := "/vmtest/src/" + p.Rel
		l.AddDir(guestDir, 0o755)
		if err := addTree(l, guestDir+"/testdata", filepath.Join(p.Dir, "testdata")); err != nil {
			return nil, nil, err
		}
		bin := GuestBinary{Name: name, Dir: guestDir}
		if !selected {
			bin.Args = SkipHostTests(p.HostTests)
		}
		init.Binaries = append(init.Binaries, bin)
	}
	l.AddData("init", init.Script(), 0o755)
	return l, names, nil
}

// addTree copies the host directory src (if it exists) to dst, following
// symlinks.
func addTree(l *Listing, dst, src string) error {
	if _, err := os.Stat(src); os.IsNotExist(err) {
		return nil
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		g := dst + "/" + filepath.ToSlash(rel)
		if fi.IsDir() {
			l.AddDir(g, fi.Mode())
		} else {
			l.AddFile(g, p, fi.Mode())
		}
		return nil
	})
}

// cachedSegment returns the archive of l under the cache, named by its
// content key, writing it only when absent; older archives of the same
// name are removed.
func (c *Config) cachedSegment(name string, l *Listing) (string, error) {
	key, err := l.Key()
	if err != nil {
		return "", err
	}
	p := filepath.Join(c.CacheDir, "initramfs", name+"-"+key+".cpio")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	old, _ := filepath.Glob(filepath.Join(c.CacheDir, "initramfs", name+"-*.cpio"))
	if err := writeSegment(p, l); err != nil {
		return "", err
	}
	for _, o := range old {
		_ = os.Remove(o)
	}
	c.Log.Info("built initramfs segment", "segment", filepath.Base(p))
	return p, nil
}

func writeSegment(p string, l *Listing) error {
	f, err := os.CreateTemp(filepath.Dir(p), filepath.Base(p)+".tmp*")
	if err != nil {
		return err
	}
	if err := WriteCPIO(f, l.Entries()); err != nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), p)
}

func concatFiles(dst string, srcs ...string) error {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	for _, s := range srcs {
		in, err := os.Open(s)
		if err != nil {
			f.Close()
			return err
		}
		_, err = io.Copy(f, in)
		in.Close()
		if err != nil {
			f.Close()
			return fmt.Errorf("concat %s: %w", s, err)
		}
	}
	return f.Close()
}

func (c *Config) boot(ctx context.Context, k *Kernel, runDir, initrd string, names []string) (*Report, error) {
	results := filepath.Join(runDir, "results.log")
	_ = os.Remove(results)
	vm := &VM{Kernel: k.Vmlinuz(), Initrd: initrd, Results: results, MemoryMB: c.MemoryMB, CPUs: c.CPUs,
		Timeout: c.Timeout, Idle: c.Idle, Interactive: c.Shell, Console: c.Console}
	start := time.Now()
	tail, vmErr := vm.Run(ctx)
	c.Log.Info("guest stopped", "took", time.Since(start).Round(time.Millisecond))
	if err := c.saveOutput(results); err != nil {
		vmErr = errors.Join(vmErr, err)
	}
	f, err := os.Open(results)
	if err != nil {
		return nil, errors.Join(vmErr, fmt.Errorf("results: %w", err))
	}
	defer f.Close()
	rep, err := ParseResults(f, names)
	if err != nil {
		return nil, errors.Join(vmErr, fmt.Errorf("results: %w", err))
	}
	rep.Filtered = filtered(c.TestArgs)
	if rerr := rep.Err(); rerr != nil || vmErr != nil {
		return rep, errors.Join(vmErr, rerr, fmt.Errorf("last console lines:\n%s", strings.Join(tail, "\n")))
	}
	return rep, nil
}

// saveOutput copies the results port's log to c.Output: the test
// binaries' output (benchmark lines included) and the marker lines,
// without the kernel's messages, as the guest wrote it, passed or not.
func (c *Config) saveOutput(results string) error {
	if c.Output == "" {
		return nil
	}
	if err := concatFiles(c.Output, results); err != nil {
		return fmt.Errorf("output: %w", err)
	}
	return nil
}

// filtered reports whether args select tests (-run or -skip).
func filtered(args []string) bool {
	for _, a := range args {
		for _, f := range []string{"-run", "-test.run", "-skip", "-test.skip"} {
			if a == f || strings.HasPrefix(a, f+"=") {
				return true
			}
		}
	}
	return false
}

// SkipHostTests returns the test binary flag that skips the named
// top-level tests (a package's HostTests: its ordinary tests, which the
// host runs), or nothing when there are none. The guest's time goes to
// what needs its kernel.
func SkipHostTests(names []string) []string {
	if len(names) == 0 {
		return nil
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	return []string{"-test.skip=^(" + strings.Join(quoted, "|") + ")$"}
}

// shortTestFlags are go test flags that test binaries know as -test.<name>.
var shortTestFlags = []string{"run", "skip", "count", "v", "timeout", "failfast", "short", "bench",
	"benchtime", "benchmem", "cpu", "parallel", "shuffle", "list", "fullpath"}

// TestArgs turns the user's flags into test binary flags: go test's short
// names get their "test." prefix, -test.v is added, and -test.timeout is
// set just under the watchdog unless given (so a hung test prints its
// goroutines before the guest is killed).
func TestArgs(user []string, watchdog time.Duration) []string {
	var out []string
	verbose, timeout := false, false
	for _, a := range user {
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "-test.") && !strings.HasPrefix(a, "--") {
			name, _, _ := strings.Cut(a[1:], "=")
			for _, s := range shortTestFlags {
				if name == s {
					a = "-test." + a[1:]
				}
			}
		}
		verbose = verbose || a == "-test.v" || strings.HasPrefix(a, "-test.v=")
		timeout = timeout || strings.HasPrefix(a, "-test.timeout")
		out = append(out, a)
	}
	if !verbose {
		out = append([]string{"-test.v"}, out...)
	}
	if !timeout {
		t := watchdog - time.Minute
		if t < time.Minute {
			t = watchdog / 2
		}
		out = append(out, "-test.timeout="+t.String())
	}
	return out
}
