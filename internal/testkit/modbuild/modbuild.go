// Package modbuild builds the programs the project's tests run against
// (servers, a cluster's components, test binaries) from the Go module
// proxy, once per machine. Each is built by a small module of its own,
// outside the workspace, whose go.mod and go.sum pin every dependency;
// the binaries go to a cache directory keyed on that go.mod and go.sum,
// what is built, the linker flags and the Go version, so that a second
// run finds them and a change of any of those builds them again. A file
// lock keeps two processes from building the same entry at once, and an
// entry appears whole or not at all.
//
// It is a tool of the tests, not of the library: nothing outside tests
// and test tools imports it.
package modbuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Build is what one cache entry holds: the binaries of Packages and the
// test binaries of Tests, all built from the module in Dir.
type Build struct {
	// Name starts the cache entry's name, such as "kubernetes-v1.36.3".
	Name string
	// Dir is the building module's directory (its go.mod and go.sum).
	Dir string
	// Packages are main packages, built with one go build; each binary
	// is named by the package path's last element.
	Packages []string
	// Tests are packages built with go test -c (without vet); each
	// binary is named by the path's last element and ".test".
	Tests []string
	// LDFlags are added to "-s -w".
	LDFlags string
	// Tags are build tags.
	Tags []string
	// Log, when set, receives a line per build step with its duration.
	Log io.Writer
}

// CacheDir returns the cache directory: $KPROXY_BUILD_CACHE, or kproxy/build
// under the user cache directory ($XDG_CACHE_HOME or ~/.cache).
func CacheDir() (string, error) {
	if d := os.Getenv("KPROXY_BUILD_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("build cache: %w (set KPROXY_BUILD_CACHE)", err)
	}
	return filepath.Join(d, "kproxy", "build"), nil
}

// Binary returns the name a package's binary has in the entry.
func Binary(pkg string) string { return path.Base(pkg) }

// TestBinary returns the name a test package's binary has in the entry.
func TestBinary(pkg string) string { return path.Base(pkg) + ".test" }

// Output returns the directory holding the entry's binaries, building
// them first if the cache lacks them (minutes on a cold Go cache). built
// reports whether it built them.
func (b Build) Output(ctx context.Context) (dir string, built bool, err error) {
	key, err := b.key(ctx)
	if err != nil {
		return "", false, err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", false, err
	}
	dir = filepath.Join(cache, b.Name+"-"+key)
	if b.complete(dir) {
		return dir, false, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", false, fmt.Errorf("build %s: %w", b.Name, err)
	}
	unlock, err := lock(dir + ".lock")
	if err != nil {
		return "", false, fmt.Errorf("build %s: %w", b.Name, err)
	}
	defer unlock()
	if b.complete(dir) {
		return dir, false, nil // another process built it while we waited
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", false, fmt.Errorf("build %s: %w", b.Name, err)
	}
	if err := b.build(ctx, tmp); err != nil {
		os.RemoveAll(tmp)
		return "", false, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", false, fmt.Errorf("build %s: %w", b.Name, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", false, fmt.Errorf("build %s: %w", b.Name, err)
	}
	return dir, true, nil
}

// complete reports whether dir holds every binary of the entry.
func (b Build) complete(dir string) bool {
	for _, name := range b.binaries() {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}

func (b Build) binaries() []string {
	var names []string
	for _, p := range b.Packages {
		names = append(names, Binary(p))
	}
	for _, p := range b.Tests {
		names = append(names, TestBinary(p))
	}
	return names
}

// key hashes what decides the binaries.
func (b Build) key(ctx context.Context) (string, error) {
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join(b.Dir, f))
		if err != nil {
			return "", fmt.Errorf("build %s: %w", b.Name, err)
		}
		h.Write(data)
	}
	gover, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("build %s: go env GOVERSION: %w", b.Name, err)
	}
	fmt.Fprintf(h, "%q\n%q\n%q\n%q\n%s", b.Packages, b.Tests, b.LDFlags, b.Tags, gover)
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

func (b Build) build(ctx context.Context, out string) error {
	ld := strings.TrimSpace("-s -w " + b.LDFlags)
	common := []string{"-trimpath", "-ldflags", ld}
	if len(b.Tags) > 0 {
		common = append(common, "-tags", strings.Join(b.Tags, ","))
	}
	if len(b.Packages) > 0 {
		args := append(append([]string{"build"}, common...), "-o", out+string(filepath.Separator))
		if err := b.run(ctx, "build "+strings.Join(b.binaries()[:len(b.Packages)], " "), append(args, b.Packages...)); err != nil {
			return err
		}
	}
	for _, p := range b.Tests {
		args := append(append([]string{"test", "-c", "-vet=off"}, common...), "-o", filepath.Join(out, TestBinary(p)), p)
		if err := b.run(ctx, "build "+TestBinary(p), args); err != nil {
			return err
		}
	}
	return nil
}

func (b Build) run(ctx context.Context, what string, args []string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = b.Dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOFLAGS=-mod=readonly")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %s in %s: %w\n%s", b.Name, what, b.Dir, err, tail(string(out), 40))
	}
	if b.Log != nil {
		fmt.Fprintf(b.Log, "%s: %s: %s\n", b.Name, what, time.Since(start).Round(time.Second))
	}
	return nil
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}
