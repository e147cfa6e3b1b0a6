//go:build linux

package testservers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a server process this package started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// start runs bin with args, its output going to a log file in dir.
func start(name, dir, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	// Pdeathsig ends the server if this process dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// The kernel sends Pdeathsig when the thread that forked the child ends,
// not the process. Go ends a thread when a goroutine locked to it exits (as
// the sandbox's namespace helpers do), so servers are forked from one
// locked thread that lives as long as the process.
var (
	spawnOnce sync.Once
	spawnReqs = make(chan spawnReq)
)

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread()
			for r := range spawnReqs {
				r.err <- r.cmd.Start()
			}
		}()
	})
	r := spawnReq{cmd: cmd, err: make(chan error, 1)}
	spawnReqs <- r
	return <-r.err
}

// stop ends the process by its pid: SIGTERM, then SIGKILL after 10 s.
func (p *proc) stop() {
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited returns an error if the process has ended.
func (p *proc) exited() error {
	select {
	case <-p.done:
		b, _ := os.ReadFile(p.log)
		return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, tail(string(b), 30))
	default:
		return nil
	}
}

// failed wraps err with the tail of the process's log.
func (p *proc) failed(err error) error {
	b, _ := os.ReadFile(p.log)
	return fmt.Errorf("%s: %w\n%s", p.name, err, tail(string(b), 30))
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// waitHTTP polls url until it answers 200 OK, the process exits, or ctx
// ends.
func waitHTTP(ctx context.Context, p *proc, url, token string) error {
	c := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	var last error
	for {
		if err := p.exited(); err != nil {
			return err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return p.failed(fmt.Errorf("not ready at %s: %v: %w", url, last, ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tempDir makes a directory for a server's files, named with this
// process's pid, after removing those that processes no longer running
// left behind.
func tempDir(kind string) (string, error) {
	prefix := "kproxy-" + kind + "-"
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range old {
		rest := strings.TrimPrefix(filepath.Base(d), prefix)
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
	d, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", prefix, os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("start %s: %w", kind, err)
	}
	return d, nil
}
