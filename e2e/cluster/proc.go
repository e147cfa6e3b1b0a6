package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a process of the cluster this package started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// enter says which namespaces a process starts in: a named network
// namespace, or those of a node's holder (network, mount and UTS).
type enter struct {
	netns  string
	holder int
}

// args returns nsenter's arguments.
func (e enter) args() []string {
	if e.holder != 0 {
		return []string{"nsenter", "--target", strconv.Itoa(e.holder), "--net", "--mount", "--uts", "--"}
	}
	return []string{"nsenter", "--net=" + nsPath(e.netns), "--"}
}

// start runs argv in the cgroup CgroupRoot/cgroup and the namespaces of
// in, with its output in logs/<name>.log. The process is a shell that
// joins the cgroups and executes nsenter, which enters the namespaces and
// executes argv: its pid is the program's.
func (c *Cluster) start(name, cgroup string, in enter, argv []string, env ...string) (*proc, error) {
	logPath := filepath.Join(c.logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer f.Close()
	p := &proc{name: name, log: logPath, done: make(chan struct{})}
	p.cmd = c.command(cgroup, in, argv)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.Env = append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return p, nil
}

// command returns the command start runs.
func (c *Cluster) command(cgroup string, in enter, argv []string) *exec.Cmd {
	args := append([]string{"-c", joinScript(c.hier, cgroup), "sh"}, in.args()...)
	return exec.Command("/bin/sh", append(args, argv...)...)
}

// alive returns an error if the process has ended.
func (p *proc) alive() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %v (log: %s)\n%s", p.name, p.err, p.log, tailFile(p.log, 20))
	default:
		return nil
	}
}

// stop ends the process by its pid: SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// wait polls check until it succeeds, the process ends or the context
// does; the error names what was awaited.
func (p *proc) wait(ctx context.Context, what string, timeout time.Duration, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		if p != nil {
			if err := p.alive(); err != nil {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("%s: not ready after %s: %v", what, timeout, last)
			if p != nil {
				msg += fmt.Sprintf(" (log: %s)\n%s", p.log, tailFile(p.log, 20))
			}
			return errors.New(msg)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tailFile returns the last lines of a file.
func tailFile(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > 64<<10 {
		f.Seek(-64<<10, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}
