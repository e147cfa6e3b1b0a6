//go:build linux

package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
)

// Tag is the build tag of tests that run in the VM.
const Tag = "vm"

// Package is a Go package with vm tests: at least one test file that
// needs the vm tag and declares a test, fuzz test or example.
type Package struct {
	ImportPath string
	Dir        string
	Rel        string   // directory relative to the module root, slash-separated
	Files      []string // the test files that need the vm tag (helpers included)
	// HostTests are the tests, fuzz tests and examples declared in test
	// files that build without the vm tag too: ordinary tests, which the
	// host's runs cover, compiled into the binary along with the vm tests.
	// The guest skips them unless the run selects tests itself.
	HostTests []string
}

// BinaryName is the test binary's file name: the package's directory
// relative to the module root, with '/' turned into '_' (so that two
// packages with the same last element do not collide).
func (p Package) BinaryName() string {
	if p.Rel == "." || p.Rel == "" {
		return "root.test"
	}
	return strings.ReplaceAll(p.Rel, "/", "_") + ".test"
}

// NeedsVM reports whether a file with this build constraint is a vm test:
// it builds with the vm tag and does not build without it (on linux/amd64).
// A file that builds either way is an ordinary test; one with no
// constraint is never a vm test.
func NeedsVM(expr constraint.Expr) bool {
	if expr == nil {
		return false
	}
	with := expr.Eval(func(tag string) bool { return platformTag(tag) || tag == Tag })
	without := expr.Eval(platformTag)
	return with && !without
}

func platformTag(tag string) bool {
	switch tag {
	case "linux", "amd64", "unix", "gc":
		return true
	}
	return strings.HasPrefix(tag, "go1.")
}

// builtWithoutVM reports whether a file with this build constraint is
// compiled into a test binary both with and without the vm tag: an
// ordinary test file (no constraint, or platform tags only).
func builtWithoutVM(expr constraint.Expr) bool {
	if expr == nil {
		return true
	}
	return expr.Eval(platformTag) && expr.Eval(func(tag string) bool { return platformTag(tag) || tag == Tag })
}

// declaredTests returns the top-level test, fuzz test and example
// functions a Go test file declares; a vm-tagged file of helpers only
// does not make its package a vm test package.
func declaredTests(src []byte) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "", src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv != nil {
			continue
		}
		for _, prefix := range []string{"Test", "Fuzz", "Example"} {
			if rest, ok := strings.CutPrefix(fn.Name.Name, prefix); ok && (rest == "" || !unicode.IsLower(rune(rest[0]))) {
				names = append(names, fn.Name.Name)
				break
			}
		}
	}
	return names, nil
}

// FileConstraint returns the //go:build constraint of a Go source file, or
// nil when it has none. Only the header (before the package clause) counts.
func FileConstraint(r io.Reader) (constraint.Expr, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "//") && !constraint.IsGoBuild(line) {
			continue
		}
		if constraint.IsGoBuild(line) {
			return constraint.Parse(line)
		}
		return nil, nil // a block comment or the package clause ends the header
	}
	return nil, sc.Err()
}

type listedPackage struct {
	ImportPath   string
	Dir          string
	TestGoFiles  []string
	XTestGoFiles []string
	Module       *struct{ Dir string }
	Error        *struct{ Err string }
}

// FindPackages lists the packages matched by patterns in the module at
// dir and returns those with vm test files.
func FindPackages(ctx context.Context, dir string, patterns []string) ([]Package, error) {
	args := append([]string{"list", "-e", "-json", "-tags", Tag, "--"}, patterns...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w: %s", strings.Join(patterns, " "), err, stderr.Bytes())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var lp listedPackage
		if err := dec.Decode(&lp); err != nil {
			return nil, fmt.Errorf("go list: %w", err)
		}
		if lp.Error != nil {
			return nil, fmt.Errorf("go list %s: %s", lp.ImportPath, lp.Error.Err)
		}
		p, err := vmPackage(lp)
		if err != nil {
			return nil, err
		}
		if p != nil {
			pkgs = append(pkgs, *p)
		}
	}
	return pkgs, nil
}

func vmPackage(lp listedPackage) (*Package, error) {
	var files, hostTests []string
	tests := false
	for _, name := range append(append([]string{}, lp.TestGoFiles...), lp.XTestGoFiles...) {
		path := filepath.Join(lp.Dir, name)
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		expr, err := FileConstraint(bytes.NewReader(src))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		vm, host := NeedsVM(expr), builtWithoutVM(expr)
		if !vm && !host {
			continue
		}
		declared, err := declaredTests(src)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if host {
			hostTests = append(hostTests, declared...)
			continue
		}
		files = append(files, name)
		tests = tests || len(declared) > 0
	}
	if !tests {
		return nil, nil
	}
	slices.Sort(hostTests)
	rel := "."
	if lp.Module != nil {
		r, err := filepath.Rel(lp.Module.Dir, lp.Dir)
		if err != nil {
			return nil, err
		}
		rel = filepath.ToSlash(r)
	}
	return &Package{ImportPath: lp.ImportPath, Dir: lp.Dir, Rel: rel, Files: files, HostTests: hostTests}, nil
}
