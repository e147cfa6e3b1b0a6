package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// errBound is a driver that did not answer within the bound.
var errBound = errors.New("did not finish within the bound")

// proc is one driver process in a namespace, spoken to line by line.
type proc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	done  chan error
	dead  bool // the process has ended and been waited for
}

// start runs argv in the named namespace (ip netns exec), in a process
// group of its own so that a driver past its bound goes with the tools it
// runs; its standard error goes to log.
func start(ns string, log io.Writer, argv ...string) (*proc, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = log
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, in: in, lines: make(chan string, 16), done: make(chan error, 1)}
	go func() {
		s := bufio.NewScanner(out)
		s.Buffer(make([]byte, 1<<20), 1<<26)
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	return p, nil
}

// read waits up to bound for the next JSON line and decodes it into v.
func (p *proc) read(bound time.Duration, v any) error {
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.dead = true
			return fmt.Errorf("driver exited: %v", <-p.done)
		}
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Error != "" {
			return errors.New(e.Error)
		}
		return json.Unmarshal([]byte(l), v)
	case <-time.After(bound):
		p.kill()
		return errBound
	}
}

// ask sends one command and reads its answer.
func (p *proc) ask(bound time.Duration, v any, cmd ...string) error {
	if _, err := fmt.Fprintln(p.in, strings.Join(cmd, " ")); err != nil {
		return err
	}
	return p.read(bound, v)
}

// quit asks the driver to exit, leaving what it wrote in the kernel.
func (p *proc) quit() {
	if p.dead {
		return
	}
	p.dead = true
	fmt.Fprintln(p.in, "quit")
	p.in.Close()
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		p.dead = false
		p.kill()
	}
}

// kill ends the driver's process group (the driver and the tools it runs).
func (p *proc) kill() {
	if p.dead {
		return
	}
	p.dead = true
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.in.Close()
	for range p.lines {
	}
	<-p.done
}

// run runs argv in ns to its end and decodes its output's one JSON line.
func run(ns string, log io.Writer, v any, argv ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stderr = log
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return json.Unmarshal(out, v)
}

func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}
