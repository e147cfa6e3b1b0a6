//go:build linux

package vmtest

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const smokeBin = "internal_vmtest_smoke.test"

// The testdata/results-*.log files are captured from real guest runs: a
// passing run, a failing test, a skipped test, a kernel panic in the middle
// of a test (sysrq crash), and a test that hung until the watchdog killed
// the guest.
func TestParseCapturedResults(t *testing.T) {
	for _, tc := range []struct {
		file    string
		wantErr []error
		passed  int
		failed  int
		skipped int
	}{
		{file: "results-pass.log", passed: 9},
		{file: "results-fail.log", wantErr: []error{ErrTestFailed}, failed: 1},
		{file: "results-skip.log", wantErr: []error{ErrTestSkipped}, passed: 9, skipped: 1},
		{file: "results-panic.log", wantErr: []error{ErrIncomplete}},
		{file: "results-timeout.log", wantErr: []error{ErrIncomplete}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			rep, err := ParseResults(f, []string{smokeBin})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Kernel != "6.1.0-56-cloud-amd64" {
				t.Errorf("kernel = %q", rep.Kernel)
			}
			err = rep.Err()
			if len(tc.wantErr) == 0 && err != nil {
				t.Fatalf("Err() = %v, want nil", err)
			}
			for _, want := range tc.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("Err() = %v, want %v", err, want)
				}
			}
			p, fl, s := rep.Summary()
			if diff := cmp.Diff([3]int{tc.passed, tc.failed, tc.skipped}, [3]int{p, fl, s}); diff != "" {
				t.Errorf("Summary (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseResults(t *testing.T) {
	out := strings.Join([]string{
		"##vmtest boot 6.1.0-test\r",
		"##vmtest modprobe-failed ip_vs_mh\r",
		"##vmtest ready 4.25s",
		"##vmtest begin a.test\r",
		"=== RUN   TestA",
		"--- PASS: TestA (0.00s)",
		"##vmtest exit a.test 0",
		"##vmtest begin b.test",
		"testing: warning: no tests to run",
		"PASS",
		"##vmtest exit b.test 0",
		"##vmtest begin extra.test",
		"panic: boom",
		"##vmtest exit extra.test 2",
		"##vmtest done",
	}, "\n")
	rep, err := ParseResults(strings.NewReader(out), []string{"a.test", "b.test", "c.test"})
	if err != nil {
		t.Fatal(err)
	}
	want := &Report{
		Kernel:         "6.1.0-test",
		Ready:          "4.25s",
		Done:           true,
		ModprobeFailed: []string{"ip_vs_mh"},
		Binaries: []*BinaryResult{
			{Name: "a.test", Started: true, Finished: true, Passed: []string{"TestA"}},
			{Name: "b.test", Started: true, Finished: true, NoTests: true},
			{Name: "c.test"},
			{Name: "extra.test", Started: true, Finished: true, Exit: 2},
		},
	}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Fatalf("report (-want +got):\n%s", diff)
	}
	err = rep.Err()
	for _, want := range []error{ErrModprobe, ErrIncomplete, ErrTestFailed} {
		if !errors.Is(err, want) {
			t.Errorf("Err() = %v, want %v", err, want)
		}
	}
	if !strings.Contains(err.Error(), "c.test never started") || !strings.Contains(err.Error(), "extra.test exit status 2") {
		t.Errorf("Err() does not name the binaries: %v", err)
	}
	if !errors.Is(err, ErrNoTests) || !strings.Contains(err.Error(), "b.test") {
		t.Errorf("Err() = %v, want ErrNoTests for b.test", err)
	}
	rep.Filtered = true
	if err := rep.Err(); errors.Is(err, ErrNoTests) {
		t.Errorf("with a test filter, a binary without matching tests is fine: %v", err)
	}
	if _, failed, _ := rep.Summary(); failed != 1 {
		t.Errorf("Summary failed = %d, want 1 (the binary that exited 2 outside any test)", failed)
	}
}

func TestParseResultsNothing(t *testing.T) {
	rep, err := ParseResults(strings.NewReader(""), []string{"a.test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("empty output: Err() = %v, want ErrIncomplete", err)
	}
}

// TestSaveOutput: -output gets the results port's log as the guest wrote
// it; no file is written without it.
func TestSaveOutput(t *testing.T) {
	dir := t.TempDir()
	results := dir + "/results.log"
	log := "##vmtest begin ipvs.test\nBenchmarkIPVS/services=10/endpoints=10-2 \t 1\t 5 ns/op\t 0.4 cold-sync/ipvsadm-R\n##vmtest exit ipvs.test 0\n"
	if err := os.WriteFile(results, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &Config{Output: dir + "/out.txt"}
	if err := c.saveOutput(results); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(c.Output)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != log {
		t.Errorf("output %q, want %q", got, log)
	}
	if err := (&Config{}).saveOutput(results); err != nil {
		t.Errorf("no output file asked for: %v", err)
	}
}
