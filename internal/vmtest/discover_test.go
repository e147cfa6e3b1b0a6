//go:build linux

package vmtest

import (
	"context"
	"go/build/constraint"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
		"a/a_test.go":                 "package a\n",
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
		Files                   []string
	}
	var got []found
	for _, p := range pkgs {
		got = append(got, found{p.ImportPath, p.Rel, p.BinaryName(), p.Files})
	}
	want := []found{
		{"example.com/m/a", "a", "a.test", []string{"a_vm_test.go", "helpers_vm_test.go"}},
		{"example.com/m/c/d", "c/d", "c_d.test", []string{"x_vm_test.go"}},
		{"example.com/m/e", "e", "e.test", []string{"only_vm_test.go"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("FindPackages (-want +got):\n%s", diff)
	}
	if _, err := FindPackages(context.Background(), dir, []string{"./nonexistent"}); err == nil {
		t.Error("pattern matching no directory: no error")
	}
}
