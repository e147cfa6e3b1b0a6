//go:build linux

package netnstest

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Skipf and Fatalf and stops the
// function under test the way the real ones do.
type recorder struct {
	testing.TB
	skipped, failed string
}

type stopped struct{}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(stopped{})
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(stopped{})
}

func record(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != (stopped{}) {
				panic(p)
			}
		}()
		f(r)
	}()
	return r
}

func TestReportSkipsLocallyAndFailsUnderCI(t *testing.T) {
	for _, c := range []struct {
		ci, reason         string
		wantSkip, wantFail bool
	}{
		{"", "ip_vs: missing", true, false},
		{"false", "ip_vs: missing", true, false},
		{"true", "ip_vs: missing", false, true},
		{"1", "ip_vs: missing", false, true},
		{"true", "", false, false},
		{"", "", false, false},
	} {
		t.Run(fmt.Sprintf("CI=%q,reason=%q", c.ci, c.reason), func(t *testing.T) {
			t.Setenv("CI", c.ci)
			r := record(t, func(tb testing.TB) { report(tb, c.reason) })
			if (r.skipped != "") != c.wantSkip || (r.failed != "") != c.wantFail {
				t.Fatalf("skipped %q, failed %q; want skip %v, fail %v", r.skipped, r.failed, c.wantSkip, c.wantFail)
			}
			if msg := r.skipped + r.failed; c.reason != "" && !strings.Contains(msg, c.reason) {
				t.Errorf("message %q lacks the reason", msg)
			}
		})
	}
}

func TestRequireRejectsUnknownFeatures(t *testing.T) {
	t.Setenv("CI", "")
	r := record(t, func(tb testing.TB) { Require(tb, "nf_tables", "ipvs") })
	if !strings.Contains(r.failed, `unknown feature "ipvs"`) || !strings.Contains(r.failed, "ip_vs") {
		t.Fatalf("failed %q, skipped %q; want a failure naming the unknown feature and the known ones", r.failed, r.skipped)
	}
}

func TestFeaturesListsEveryProbe(t *testing.T) {
	got := Features()
	if got[0] != "root" || len(got) != len(probes())+1 {
		t.Fatalf("Features() = %v", got)
	}
}
