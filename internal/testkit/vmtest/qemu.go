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
	"sync/atomic"
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
	Idle        time.Duration // watchdog: qemu is killed once the guest wrote nothing for this long; 0: never (nor with Interactive)
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

// errIdle is the cause of a guest stopped for writing nothing.
var errIdle = errors.New("the guest wrote nothing")

// idleTick is how often the idle watchdog looks at the guest's output.
const idleTick = 10 * time.Second

// watchIdle returns errIdle once progress (a count of the bytes the guest
// wrote) has not moved for idle, looking at each tick (the time of the
// tick is the time it looks); nil when ctx ends first. The first tick
// starts the count. A guest that is slow (emulated, on a busy machine)
// keeps writing test output and is let run; one that hangs writes nothing.
func watchIdle(ctx context.Context, idle time.Duration, ticks <-chan time.Time, progress func() int64) error {
	last := progress()
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-ticks:
			if p := progress(); p != last || since.IsZero() {
				last, since = p, now
			} else if now.Sub(since) >= idle {
				return errIdle
			}
		}
	}
}

// Run boots the guest and waits until it powers off (or the watchdog or
// ctx stops it: then the qemu process this started is killed by its pid).
// It returns the last lines of the console, for diagnostics.
func (v *VM) Run(ctx context.Context) (tail []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, v.Timeout)
	defer cancel()
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var written atomic.Int64          // console bytes; the results file's are read from its size
	if v.Idle > 0 && !v.Interactive { // a debug shell may sit idle
		go func() {
			t := time.NewTicker(idleTick)
			defer t.Stop()
			if err := watchIdle(ctx, v.Idle, t.C, func() int64 {
				n := written.Load()
				if fi, err := os.Stat(v.Results); err == nil {
					n += fi.Size()
				}
				return n
			}); err != nil {
				stop(err)
			}
		}()
	}
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
	go func() { done <- copyLines(v.Console, countingReader{pr, &written}, 40) }()
	werr := cmd.Wait()
	pw.Close()
	tail = <-done
	switch {
	case errors.Is(context.Cause(ctx), errIdle):
		return tail, fmt.Errorf("%w: %w for %v", ErrTimeout, errIdle, v.Idle)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return tail, fmt.Errorf("%w after %v", ErrTimeout, v.Timeout)
	case ctx.Err() != nil:
		return tail, ctx.Err()
	case werr != nil:
		return tail, fmt.Errorf("qemu: %w", werr)
	}
	return tail, nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
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
