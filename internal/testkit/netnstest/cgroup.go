//go:build linux

package netnstest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Cgroup runs asks from a process inside a cgroup v2 directory: a socket
// belongs to the cgroup of the process that made it, so that the cgroup's
// socket hooks (a socket-level load balancer attached there) see the asks
// made with InCgroup, from whichever host's namespace. The process is the
// test binary itself, started straight into the cgroup (clone3 with
// CLONE_INTO_CGROUP); the package's TestMain must call Main, which turns
// such a process into the asker. It is the only process the kit starts in
// the cgroup, and it ends when the test does.
type Cgroup struct {
	// Dir is the cgroup's directory.
	Dir string

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer

	mu      sync.Mutex
	enc     *json.Encoder
	next    uint64
	pending map[uint64]chan cgReply
	err     error // set when the process is gone
}

// askerEnv tells a test binary started by StartCgroup to serve asks.
const askerEnv = "KPROXY_NETNSTEST_CGROUP_ASKER"

// Main runs the package's tests, or, in a process StartCgroup started,
// serves asks until its standard input closes. Call it from TestMain:
//
//	func TestMain(m *testing.M) { netnstest.Main(m) }
func Main(m *testing.M) {
	if os.Getenv(askerEnv) == "1" {
		os.Exit(serveAsks(os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// InCgroup makes the ask from the cgroup's process, from a socket made in
// the asking host's namespace.
func InCgroup(c *Cgroup) AskOption { return func(cfg *askConfig) { cfg.cgroup = c } }

// cgRequest is one ask for the cgroup's process.
type cgRequest struct {
	ID       uint64 `json:"id"`
	NS       string `json:"ns"`
	Host     string `json:"host"`
	Proto    string `json:"proto"`
	Dst      string `json:"dst"`
	From     string `json:"from,omitempty"`
	Deadline int64  `json:"deadline"`
	// UDP: see the Unconnected and KeepSocket options.
	UDP udpAsk `json:"udp"`
}

// cgReply is its outcome: the answer, or the error as far as a test
// tells errors apart.
type cgReply struct {
	ID       uint64 `json:"id"`
	Text     string `json:"text,omitempty"`
	Sport    uint16 `json:"sport,omitempty"`
	Peer     string `json:"peer,omitempty"`
	Err      string `json:"err,omitempty"`
	Errno    int    `json:"errno,omitempty"`
	Timeout  bool   `json:"timeout,omitempty"`
	AtSocket bool   `json:"atSocket,omitempty"`
	// Cgroup is the process's cgroup, in its first line (ID 0).
	Cgroup string `json:"cgroup,omitempty"`
}

// StartCgroup starts the asker process in the cgroup directory dir and
// stops it when the test ends. It fails the test when the process does
// not start in dir (the package's TestMain does not call Main, or dir is
// no cgroup v2 directory).
func StartCgroup(t testing.TB, dir string) *Cgroup {
	t.Helper()
	c, err := startCgroup(dir)
	if err != nil {
		t.Fatalf("netnstest: %v", err)
	}
	t.Cleanup(func() {
		if err := c.stop(); err != nil {
			t.Errorf("netnstest: %v", err)
		}
	})
	return c
}

func startCgroup(dir string) (*Cgroup, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	defer unix.Close(fd)
	c := &Cgroup{Dir: dir, pending: map[uint64]chan cgReply{}}
	c.cmd = exec.Command(exe, "-test.run=^$", "-test.bench=^$", "-test.fuzz=^$")
	c.cmd.Env = append(os.Environ(), askerEnv+"=1")
	c.cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Pdeathsig: syscall.SIGKILL}
	c.cmd.Stderr = &c.stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start an asker in cgroup %s: %w", dir, err)
	}
	c.enc = json.NewEncoder(c.stdin)
	r := bufio.NewReader(out)
	first, err := readReply(r)
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("the asker in cgroup %s did not start (does the package's TestMain call netnstest.Main?): %v: %s",
			dir, err, strings.TrimSpace(c.stderr.String()))
	}
	if want := cgroupOf(dir); want != "" && first.Cgroup != want {
		c.stop()
		return nil, fmt.Errorf("the asker runs in cgroup %q, not %q", first.Cgroup, want)
	}
	go c.read(r)
	return c, nil
}

// cgroupOf returns the path of a cgroup directory within its hierarchy,
// as /proc/<pid>/cgroup shows it, found through its mount; "" when
// unknown.
func cgroupOf(dir string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	dir = filepath.Clean(dir)
	best := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(f) || f[sep+1] != "cgroup2" || len(f) < 5 {
			continue
		}
		mnt := f[4]
		if (dir == mnt || strings.HasPrefix(dir, mnt+"/")) && len(mnt) > len(best) {
			best = mnt
		}
	}
	if best == "" {
		return ""
	}
	rel := strings.TrimPrefix(dir, best)
	if rel == "" {
		rel = "/"
	}
	return rel
}

func readReply(r *bufio.Reader) (cgReply, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return cgReply{}, err
	}
	var rep cgReply
	if err := json.Unmarshal(line, &rep); err != nil {
		return cgReply{}, fmt.Errorf("unexpected output %q", strings.TrimSpace(string(line)))
	}
	return rep, nil
}

// read hands each reply to its ask until the process's output ends.
func (c *Cgroup) read(r *bufio.Reader) {
	for {
		rep, err := readReply(r)
		c.mu.Lock()
		if err != nil {
			c.err = fmt.Errorf("the asker in cgroup %s is gone: %v: %s", c.Dir, err, strings.TrimSpace(c.stderr.String()))
			for id, ch := range c.pending {
				close(ch)
				delete(c.pending, id)
			}
			c.mu.Unlock()
			return
		}
		if ch, ok := c.pending[rep.ID]; ok {
			ch <- rep
			delete(c.pending, rep.ID)
		}
		c.mu.Unlock()
	}
}

// stop ends the process: its input closes, and it is killed (by its pid)
// if it has not ended a few seconds later.
func (c *Cgroup) stop() error {
	c.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("the asker in cgroup %s: %v: %s", c.Dir, err, strings.TrimSpace(c.stderr.String()))
		}
		return nil
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
		<-done
		return fmt.Errorf("the asker in cgroup %s did not end; killed", c.Dir)
	}
}

// exchange runs one ask in the cgroup's process.
func (c *Cgroup) exchange(ctx context.Context, h *Host, proto string, dst, from netip.AddrPort, deadline time.Time, u udpAsk) (exchanged, error) {
	req := cgRequest{NS: filepath.Join(RunDir, h.NSName), Host: h.Name, Proto: proto, Dst: dst.String(),
		Deadline: deadline.UnixNano(), UDP: u}
	if from.IsValid() {
		req.From = from.String()
	}
	ch := make(chan cgReply, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return exchanged{}, c.err
	}
	c.next++
	req.ID = c.next
	c.pending[req.ID] = ch
	err := c.enc.Encode(req)
	c.mu.Unlock()
	if err != nil {
		return exchanged{}, fmt.Errorf("ask the process in cgroup %s: %w", c.Dir, err)
	}
	select {
	case rep, ok := <-ch:
		if !ok {
			c.mu.Lock()
			defer c.mu.Unlock()
			return exchanged{}, c.err
		}
		x := exchanged{text: rep.Text, sport: rep.Sport}
		x.peer, _ = netip.ParseAddrPort(rep.Peer)
		return x, rep.error()
	case <-ctx.Done():
		return exchanged{}, ctx.Err()
	}
}

// remoteError is an error of the cgroup's process, as far as classify
// and AskError tell errors apart.
type remoteError struct {
	msg      string
	errno    unix.Errno
	timeout  bool
	atSocket bool
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Unwrap() []error {
	var out []error
	if e.errno != 0 {
		out = append(out, e.errno)
	}
	if e.timeout {
		out = append(out, os.ErrDeadlineExceeded)
	}
	if e.atSocket {
		out = append(out, errAtSocket)
	}
	return out
}

func (r cgReply) error() error {
	if r.Err == "" {
		return nil
	}
	return &remoteError{msg: r.Err, errno: unix.Errno(r.Errno), timeout: r.Timeout, atSocket: r.AtSocket}
}

// serveAsks is the cgroup's process: it answers asks read from in, each
// in its own goroutine, on out. It returns its exit code.
func serveAsks(in io.Reader, out io.Writer) int {
	self, _ := os.ReadFile("/proc/self/cgroup")
	cg := ""
	for _, line := range strings.Split(string(self), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			cg = p
		}
	}
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	send := func(r cgReply) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(r)
	}
	send(cgReply{Cgroup: cg})
	hosts := &hostCache{m: map[string]*Host{}}
	defer hosts.close()
	dec := json.NewDecoder(in)
	var wg sync.WaitGroup
	for {
		var req cgRequest
		if err := dec.Decode(&req); err != nil {
			break
		}
		wg.Go(func() { send(serveAsk(hosts, req)) })
	}
	wg.Wait()
	return 0
}

// hostCache keeps a Host per namespace the asks come from.
type hostCache struct {
	mu sync.Mutex
	m  map[string]*Host
}

func (hc *hostCache) get(path, name string) (*Host, error) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if h, ok := hc.m[path]; ok {
		return h, nil
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	h := &Host{Name: name, NS: ns}
	hc.m[path] = h
	return h, nil
}

func (hc *hostCache) close() {
	for _, h := range hc.m {
		h.mu.Lock()
		h.closeKept()
		h.mu.Unlock()
		h.NS.Close()
	}
}

func serveAsk(hosts *hostCache, req cgRequest) cgReply {
	rep := cgReply{ID: req.ID}
	fail := func(err error) cgReply {
		rep.Err = err.Error()
		var errno unix.Errno
		if errors.As(err, &errno) {
			rep.Errno = int(errno)
		}
		rep.Timeout = classify(err) == ErrTimeout
		rep.AtSocket = errors.Is(err, errAtSocket)
		return rep
	}
	h, err := hosts.get(req.NS, req.Host)
	if err != nil {
		return fail(err)
	}
	dst, err := netip.ParseAddrPort(req.Dst)
	if err != nil {
		return fail(err)
	}
	var from netip.AddrPort
	if req.From != "" {
		if from, err = netip.ParseAddrPort(req.From); err != nil {
			return fail(err)
		}
	}
	x, err := h.exchange(context.Background(), req.Proto, dst, from, time.Unix(0, req.Deadline), req.UDP)
	rep.Text, rep.Sport = x.text, x.sport
	if x.peer.IsValid() {
		rep.Peer = x.peer.String()
	}
	if err != nil {
		return fail(err)
	}
	return rep
}
