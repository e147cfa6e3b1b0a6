//go:build linux

package vmtest

import (
	"context"
	"go/build/constraint"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestNeedsVM(t *testing.T) {
	for line, want := range map[string]bool{
		"//go:build vm":                   true,
		"//go:build vm && linux":          true,
		"//go:build privileged || vm":     true,
		"//go:build vm && go1.21":         true,
		"//go:build vm && privileged":     false, // needs privileged too: not built with -tags vm
		"//go:build privileged":           false,
		"//go:build linux":                false,
		"//go:build !vm":                  false,
		"//go:build vm && !linux":         false,
		"//go:build vm && (arm64 || 386)": false,
	} {
		expr, err := constraint.Parse(line)
		if err != nil {
			t.Fatal(err)
		}
		if got := NeedsVM(expr); got != want {
			t.Errorf("NeedsVM(%s) = %v, want %v", line, got, want)
		}
	}
	if NeedsVM(nil) {
		t.Error("NeedsVM(nil) = true")
	}
}

func TestFileConstraint(t *testing.T) {
	for src, want := range map[string]string{
		"// Copyright\n\n//go:build vm\n\npackage x\n": "vm",
		"//go:build privileged || vm\npackage x\n":     "privileged || vm",
		"package x\n\n//go:build vm\n":                 "",
		"/* block */\n//go:build vm\npackage x\n":      "",
	} {
		expr, err := FileConstraint(strings.NewReader(src))
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if expr != nil {
			got = expr.String()
		}
		if got != want {
			t.Errorf("FileConstraint(%q) = %q, want %q", src, got, want)
		}
	}
}

func TestFindPackages(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":                      "module example.com/m\n\ngo 1.22\n",
		"a/a.go":                      "package a\n",
		"a/a_vm_test.go":              "//go:build vm\n\npackage a\n\nimport \"testing\"\n\nfunc TestA(t *testing.T) {}\n",
		"a/helpers_vm_test.go":        "//go:build vm\n\npackage a\n\nfunc helper() {}\n",
		"a/a_test.go":                 "package a\n\nimport \"testing\"\n\nfunc TestUnit(t *testing.T) {}\n\nfunc ExampleUnit() {}\n",
		"a/linux_test.go":             "//go:build linux\n\npackage a\n\nimport \"testing\"\n\nfunc FuzzLinux(f *testing.F) {}\n",
		"a/host_only_test.go":         "//go:build linux && !vm\n\npackage a\n\nimport \"testing\"\n\nfunc TestNotInTheBinary(t *testing.T) {}\n",
		"b/b.go":                      "package b\n",
		"b/b_netns_test.go":           "//go:build privileged\n\npackage b\n\nimport \"testing\"\n\nfunc TestB(t *testing.T) {}\n",
		"c/d/d.go":                    "package d\n",
		"c/d/x_vm_test.go":            "//go:build vm || privileged\n\npackage d_test\n\nfunc Example() {}\n",
		"e/only_vm_test.go":           "//go:build vm\n\npackage e\n\nimport \"testing\"\n\nfunc FuzzE(f *testing.F) {}\n",
		"f/f.go":                      "package f\n",
		"f/helpers_vm_test.go":        "//go:build privileged || vm\n\npackage f\n\nfunc Testify() {}\n\nfunc (x T) TestM() {}\n\ntype T int\n",
		"testdata/ignored_vm_test.go": "//go:build vm\n\npackage ignored\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("GOWORK", "off")
	t.Setenv("GOFLAGS", "-mod=mod")
	pkgs, err := FindPackages(context.Background(), dir, []string{"./..."})
	if err != nil {
		t.Fatal(err)
	}
	type found struct {
		ImportPath, Rel, Binary string
		Files, HostTests        []string
	}
	var got []found
	for _, p := range pkgs {
		got = append(got, found{p.ImportPath, p.Rel, p.BinaryName(), p.Files, p.HostTests})
	}
	want := []found{
		{"example.com/m/a", "a", "a.test", []string{"a_vm_test.go", "helpers_vm_test.go"}, []string{"ExampleUnit", "FuzzLinux", "TestUnit"}},
		{"example.com/m/c/d", "c/d", "c_d.test", []string{"x_vm_test.go"}, nil},
		{"example.com/m/e", "e", "e.test", []string{"only_vm_test.go"}, nil},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("FindPackages (-want +got):\n%s", diff)
	}
	if _, err := FindPackages(context.Background(), dir, []string{"./nonexistent"}); err == nil {
		t.Error("pattern matching no directory: no error")
	}
}

func TestSkipHostTests(t *testing.T) {
	if got := SkipHostTests(nil); got != nil {
		t.Errorf("SkipHostTests(nil) = %q, want nothing", got)
	}
	got := SkipHostTests([]string{"TestA", "ExampleB_c", "FuzzD"})
	want := []string{"-test.skip=^(TestA|ExampleB_c|FuzzD)$"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SkipHostTests (-want +got):\n%s", diff)
	}
	re := regexp.MustCompile(strings.TrimPrefix(got[0], "-test.skip="))
	for name, skipped := range map[string]bool{"TestA": true, "FuzzD": true, "TestAB": false, "TestVM": false} {
		if re.MatchString(name) != skipped {
			t.Errorf("%s skipped = %v, want %v", name, !skipped, skipped)
		}
	}
}

// The guest skips a package's host tests unless the run selects tests
// itself, in which case the selection is the user's alone.
func TestGuestSkipsHostTests(t *testing.T) {
	pkgs := []Package{
		{Rel: "a", Dir: t.TempDir(), HostTests: []string{"TestUnit"}},
		{Rel: "b", Dir: t.TempDir()},
	}
	script := func(args ...string) string {
		c := Config{TestArgs: args, Timeout: 10 * time.Minute}
		l, _, err := c.testsListing(t.TempDir(), pkgs)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Entries() {
			if e.Path == "init" {
				return string(e.Data)
			}
		}
		t.Fatal("no /init in the listing")
		return ""
	}
	s := script()
	if !strings.Contains(s, "/vmtest/bin/a.test -test.v -test.timeout=9m0s '-test.skip=^(TestUnit)$' 2>&1") {
		t.Errorf("a.test does not skip its host test:\n%s", s)
	}
	if !strings.Contains(s, "/vmtest/bin/b.test -test.v -test.timeout=9m0s 2>&1") {
		t.Errorf("b.test has flags of its own:\n%s", s)
	}
	if s := script("-run", "TestUnit"); strings.Contains(s, "-test.skip") {
		t.Errorf("a selection of the user's is narrowed further:\n%s", s)
	}
}
