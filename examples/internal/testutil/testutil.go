// Package testutil holds helpers for the examples' tests.
package testutil

import (
	"os"
	"testing"
)

// CI reports whether the tests run under CI=true, where a test that cannot
// run must fail instead of skipping.
func CI() bool { return os.Getenv("CI") == "true" }

// SkipOrFail skips t with reason, or fails it under CI.
func SkipOrFail(t testing.TB, reason string) {
	t.Helper()
	if CI() {
		t.Fatalf("cannot run under CI=true: %s", reason)
	}
	t.Skip(reason)
}

// RequireRoot skips or fails t unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root")
	}
}
