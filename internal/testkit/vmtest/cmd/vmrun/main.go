//go:build linux

// Command vmrun runs the module's vm-tagged tests in a qemu guest booting
// Debian's cloud kernel (see docs/vm-tests.md). `make test-vm` calls it.
//
//	go run ./internal/testkit/vmtest/cmd/vmrun [-pkgs ./...] [-timeout 30m] [-shell] [-output file] [-- test flags]
//
// Arguments after the flags go to every test binary (-run X, -count 2, ...);
// without any, the environment variable VMTEST_FLAGS gives them, split at
// white space (so that make can pass a regular expression with | or $
// without the shell seeing it). VMTEST_PKGS is the default of -pkgs.
// It exits 1 when any test failed or was skipped, or the guest did not
// finish.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/vmtest"
)

func main() {
	os.Exit(run())
}

func run() int {
	var c vmtest.Config
	pkgs := flag.String("pkgs", envOr("VMTEST_PKGS", "./..."), "space-separated package patterns to search for vm tests")
	flag.StringVar(&c.ModuleDir, "C", ".", "module root directory")
	flag.StringVar(&c.CacheDir, "cache", "", "cache directory (default <module>/.cache/vm)")
	flag.DurationVar(&c.Timeout, "timeout", 60*time.Minute, "watchdog for the whole guest run: a slow guest (emulated, on a busy machine) that keeps writing test output runs until this")
	flag.DurationVar(&c.Idle, "idle", 10*time.Minute, "watchdog for a guest that writes nothing for this long: a hang")
	flag.IntVar(&c.MemoryMB, "mem", 2048, "guest memory in MiB")
	flag.BoolVar(&c.Shell, "shell", false, "start a shell in the guest after the tests (interactive)")
	flag.BoolVar(&c.Keep, "keep", false, "keep the run directory (binaries, initramfs, results.log) even when the run passed")
	flag.StringVar(&c.Output, "output", "", "copy the tests' output (without kernel messages; benchmark lines included) to this file")
	quiet := flag.Bool("q", false, "do not stream the guest console")
	flag.Parse()
	c.Patterns = strings.Fields(*pkgs)
	c.TestArgs = flag.Args()
	if len(c.TestArgs) == 0 {
		c.TestArgs = strings.Fields(os.Getenv("VMTEST_FLAGS"))
	}
	if v, ok := os.LookupEnv("CI"); ok {
		c.Env = append(c.Env, "CI="+v)
	}
	if !*quiet {
		c.Console = os.Stdout
	}
	c.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	start := time.Now()
	rep, err := vmtest.Run(ctx, c)
	if rep != nil {
		printReport(rep)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmrun: FAIL: %v\n", err)
		return 1
	}
	fmt.Printf("vmrun: ok in %v\n", time.Since(start).Round(time.Millisecond))
	return 0
}

func envOr(name, def string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return def
}

func printReport(rep *vmtest.Report) {
	fmt.Printf("\nvm test results (kernel %s, modules loaded at %s of guest uptime):\n", rep.Kernel, rep.Ready)
	for _, b := range rep.Binaries {
		status := "ok"
		switch {
		case !b.Started:
			status = "NOT STARTED"
		case !b.Finished:
			status = "DID NOT FINISH"
		case !b.OK():
			status = fmt.Sprintf("FAIL (exit %d)", b.Exit)
		}
		fmt.Printf("  %-40s %-16s %d passed, %d failed, %d skipped\n", b.Name, status, len(b.Passed), len(b.Failed), len(b.Skipped))
	}
	p, f, s := rep.Summary()
	fmt.Printf("vm: %d passed, %d failed, %d skipped\n", p, f, s)
}
