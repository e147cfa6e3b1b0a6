//go:build linux

package vmtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// VM is one qemu boot of the test guest.
type VM struct {
	Kernel      string        // kernel image
	Initrd      string        // initramfs
	Results     string        // host file that receives the guest's second serial port
	MemoryMB    int           // guest memory
	CPUs        int           // guest CPUs
	Timeout     time.Duration // watchdog: qemu is killed after this long
	Interactive bool          // connect the console to the runner's stdin (debug shell)
	Console     io.Writer     // receives the console output as it comes
}

// Args returns qemu's command line. KVM is not used: on the machines this
// runs on it fails with emulation errors, while TCG boots in seconds.
func (v *VM) Args() []string {
	return []string{
		"-accel", "tcg,thread=multi", "-cpu", "max",
		"-smp", strconv.Itoa(v.CPUs), "-m", strconv.Itoa(v.MemoryMB),
		"-nographic", "-no-reboot",
		// ttyS0: console and monitor on stdio; ttyS1: the results file.
		"-serial", "mon:stdio", "-serial", "file:" + v.Results,
		"-kernel", v.Kernel, "-initrd", v.Initrd,
		"-append", "console=ttyS0 quiet panic=-1 oops=panic",
	}
}

// ErrTimeout is returned when the watchdog stopped the guest.
var ErrTimeout = errors.New("vm watchdog timeout")

// Run boots the guest and waits until it powers off (or the watchdog or
// ctx stops it: then the qemu process this started is killed by its pid).
// It returns the last lines of the console, for diagnostics.
func (v *VM) Run(ctx context.Context) (tail []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, v.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", v.Args()...)
	cmd.WaitDelay = 5 * time.Second
	if v.Interactive {
		cmd.Stdin = os.Stdin
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	done := make(chan []string)
	go func() { done <- copyLines(v.Console, pr, 40) }()
	werr := cmd.Wait()
	pw.Close()
	tail = <-done
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return tail, fmt.Errorf("%w after %v", ErrTimeout, v.Timeout)
	case ctx.Err() != nil:
		return tail, ctx.Err()
	case werr != nil:
		return tail, fmt.Errorf("qemu: %w", werr)
	}
	return tail, nil
}

// copyLines copies r to w and returns the last n lines.
func copyLines(w io.Writer, r io.Reader, n int) []string {
	var tail []string
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			if w != nil {
				_, _ = io.WriteString(w, line)
			}
			tail = append(tail, strings.TrimRight(line, "\r\n"))
			if len(tail) > n {
				tail = tail[1:]
			}
		}
		if err != nil {
			_, _ = io.Copy(io.Discard, br)
			return tail
		}
	}
}
