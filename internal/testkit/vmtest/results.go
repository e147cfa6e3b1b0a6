//go:build linux

package vmtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// BinaryResult is what one test binary did in the guest.
type BinaryResult struct {
	Name     string
	Started  bool     // its begin line was seen
	Finished bool     // its exit line was seen
	Exit     int      // exit status (valid when Finished)
	Passed   []string // tests that passed ("--- PASS: TestX")
	Failed   []string // tests that failed
	Skipped  []string // tests that were skipped
	NoTests  bool     // "testing: warning: no tests to run"
}

// OK reports whether the binary ran to the end, exited 0 and skipped
// nothing.
func (b *BinaryResult) OK() bool {
	return b.Finished && b.Exit == 0 && len(b.Skipped) == 0 && len(b.Failed) == 0
}

// Report is the outcome of one VM run, parsed from the results port.
type Report struct {
	Kernel         string // release the guest booted, from the boot line
	Ready          string // guest uptime when the modules were loaded ("4.12s")
	Binaries       []*BinaryResult
	Done           bool     // the done line was seen: /init reached its end
	ModprobeFailed []string // modules that did not load
	RunDir         string   // the run's files (binaries, initramfs, results.log); kept when it failed
	// Filtered says the tests were selected (-run, -skip): a binary that
	// then runs no test is fine. Without a filter it is a failure, since
	// only packages that declare vm tests are run.
	Filtered bool
}

// ParseResults reads the guest's results output. expected names the
// binaries that should have run, in order; any of them that does not appear
// is reported as not started.
func ParseResults(r io.Reader, expected []string) (*Report, error) {
	rep := &Report{}
	byName := make(map[string]*BinaryResult)
	for _, name := range expected {
		b := &BinaryResult{Name: name}
		rep.Binaries = append(rep.Binaries, b)
		byName[name] = b
	}
	var cur *BinaryResult
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if rest, ok := strings.CutPrefix(line, Marker+" "); ok {
			cur = rep.marker(rest, byName, cur)
			continue
		}
		if cur != nil {
			cur.testLine(line)
		}
	}
	return rep, sc.Err()
}

func (rep *Report) marker(rest string, byName map[string]*BinaryResult, cur *BinaryResult) *BinaryResult {
	f := strings.Fields(rest)
	if len(f) == 0 {
		return cur
	}
	switch {
	case f[0] == "boot" && len(f) > 1:
		rep.Kernel = f[1]
	case f[0] == "ready" && len(f) > 1:
		rep.Ready = f[1]
	case f[0] == "modprobe-failed" && len(f) > 1:
		rep.ModprobeFailed = append(rep.ModprobeFailed, f[1])
	case f[0] == "begin" && len(f) > 1:
		b := byName[f[1]]
		if b == nil {
			b = &BinaryResult{Name: f[1]}
			byName[f[1]] = b
			rep.Binaries = append(rep.Binaries, b)
		}
		b.Started = true
		return b
	case f[0] == "exit" && len(f) > 2:
		if b := byName[f[1]]; b != nil {
			if n, err := strconv.Atoi(f[2]); err == nil {
				b.Exit, b.Finished = n, true
			}
		}
		return nil
	case f[0] == "done":
		rep.Done = true
		return nil
	}
	return cur
}

func (b *BinaryResult) testLine(line string) {
	t := strings.TrimLeft(line, " \t")
	for prefix, list := range map[string]*[]string{
		"--- PASS: ": &b.Passed, "--- FAIL: ": &b.Failed, "--- SKIP: ": &b.Skipped,
	} {
		if rest, ok := strings.CutPrefix(t, prefix); ok {
			name, _, _ := strings.Cut(rest, " (")
			*list = append(*list, name)
		}
	}
	if strings.HasPrefix(t, "testing: warning: no tests to run") {
		b.NoTests = true
	}
}

// Typed reasons for a failed run, for errors.Is.
var (
	ErrTestFailed  = errors.New("vm test failed")
	ErrTestSkipped = errors.New("vm test skipped (a missing kernel feature is a failure in the VM)")
	ErrIncomplete  = errors.New("vm run incomplete (crash, kernel panic or timeout)")
	ErrModprobe    = errors.New("kernel module failed to load")
	ErrNoTests     = errors.New("vm test binary ran no test")
)

// Err returns nil when every expected binary ran, exited 0 and skipped no
// test, every module loaded, and /init reached its end; otherwise an error
// naming each problem.
func (rep *Report) Err() error {
	var errs []error
	if len(rep.ModprobeFailed) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s", ErrModprobe, strings.Join(rep.ModprobeFailed, ", ")))
	}
	for _, b := range rep.Binaries {
		switch {
		case !b.Started:
			errs = append(errs, fmt.Errorf("%w: %s never started", ErrIncomplete, b.Name))
		case !b.Finished:
			errs = append(errs, fmt.Errorf("%w: %s did not finish", ErrIncomplete, b.Name))
		case b.Exit != 0 || len(b.Failed) > 0:
			errs = append(errs, fmt.Errorf("%w: %s exit status %d, failed: %s", ErrTestFailed, b.Name, b.Exit, strings.Join(b.Failed, ", ")))
		}
		if len(b.Skipped) > 0 {
			errs = append(errs, fmt.Errorf("%w: %s: %s", ErrTestSkipped, b.Name, strings.Join(b.Skipped, ", ")))
		}
		if b.NoTests && !rep.Filtered {
			errs = append(errs, fmt.Errorf("%w: %s", ErrNoTests, b.Name))
		}
	}
	if !rep.Done {
		errs = append(errs, fmt.Errorf("%w: the guest did not reach the end of /init", ErrIncomplete))
	}
	return errors.Join(errs...)
}

// Summary counts tests (not binaries) across the run.
func (rep *Report) Summary() (passed, failed, skipped int) {
	for _, b := range rep.Binaries {
		passed += len(b.Passed)
		failed += len(b.Failed)
		skipped += len(b.Skipped)
		if b.Finished && b.Exit != 0 && len(b.Failed) == 0 {
			failed++ // a binary that failed outside any test (panic, bad flag)
		}
	}
	return passed, failed, skipped
}
