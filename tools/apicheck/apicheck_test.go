package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheck: the check passes while the API is next.txt's, fails when
// the code changes it until make api writes it again, and fails on a
// feature of the last release that is gone or changed (a signature, a
// method added to an interface) until next.txt declares it; an addition
// is compatible.
func TestCheck(t *testing.T) {
	mod, api := t.TempDir(), t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(mod, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.26\n")
	code := func(text string) { write("m.go", "package m\n\n"+text) }
	features := func() []string {
		t.Helper()
		fs, err := Features(mod)
		if err != nil {
			t.Fatal(err)
		}
		return fs
	}
	mustCheck := func(want string) {
		t.Helper()
		err := Check(api, features())
		switch {
		case want == "" && err != nil:
			t.Fatalf("check failed: %v", err)
		case want != "" && err == nil:
			t.Fatalf("check passed, want a failure saying %q", want)
		case want != "" && !strings.Contains(err.Error(), want):
			t.Fatalf("check failed with %v, want %q", err, want)
		}
	}
	mustWrite := func() {
		t.Helper()
		if err := Write(api, features()); err != nil {
			t.Fatal(err)
		}
	}

	code("func F(s string) {}\n\ntype I interface{ M() }\n\ntype S struct {\n\tA int\n\tb int\n}\n\nconst C = 3\n")
	mustCheck("make api writes it")
	mustWrite()
	mustCheck("")
	want := []string{
		"pkg example.com/m, const C untyped int = 3",
		"pkg example.com/m, func F(string)",
		"pkg example.com/m, type I interface { M }",
		"pkg example.com/m, type I interface, M()",
		"pkg example.com/m, type S struct",
		"pkg example.com/m, type S struct, A int",
	}
	if got := features(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("features:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The release.
	next, err := os.ReadFile(filepath.Join(api, nextFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(api, "v0.1.0.txt"), next, 0o644); err != nil {
		t.Fatal(err)
	}

	// An addition: next.txt must say so, and nothing breaks.
	code("func F(s string) {}\n\nfunc G() {}\n\ntype I interface{ M() }\n\ntype S struct {\n\tA int\n\tb int\n}\n\nconst C = 3\n")
	mustCheck("+ pkg example.com/m, func G()")
	mustWrite()
	mustCheck("")

	// A changed signature and a method added to an interface break the
	// release's API.
	code("func F(n int) {}\n\nfunc G() {}\n\ntype I interface{ M(); N() }\n\ntype S struct {\n\tA int\n\tb int\n}\n\nconst C = 3\n")
	mustWrite()
	mustCheck("pkg example.com/m, func F(string)")
	mustCheck("pkg example.com/m, type I interface { M }")
	text, err := os.ReadFile(filepath.Join(api, nextFile))
	if err != nil {
		t.Fatal(err)
	}
	declared := "- pkg example.com/m, func F(string)\n- pkg example.com/m, type I interface { M }\n"
	if err := os.WriteFile(filepath.Join(api, nextFile), append([]byte(declared), text...), 0o644); err != nil {
		t.Fatal(err)
	}
	mustCheck("")
	mustWrite() // keeps the declarations
	mustCheck("")

	// A declaration of what is still there is an error.
	code("func F(s string) {}\n\nfunc G() {}\n\ntype I interface{ M(); N() }\n\ntype S struct {\n\tA int\n\tb int\n}\n\nconst C = 3\n")
	mustWrite()
	mustCheck("declares removed what the API still has")
}
