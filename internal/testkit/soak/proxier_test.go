//go:build soak

package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// The proxier process is the test binary run again with childEnv set:
// TestMain then runs runProxier instead of the tests. The node's network
// namespace arrives as its first inherited file (descriptor nsFD); it
// reads commands from standard input and writes events to standard
// output, one JSON object a line, and exits when its input ends.

// childEnv marks the proxier process.
const childEnv = "KPROXY_SOAK_PROXIER"

// nsFD is the descriptor of the first of exec.Cmd.ExtraFiles.
const nsFD = 3

// statsEvery is how often the proxier reports its goroutines and heap.
const statsEvery = 2 * time.Second

// runProxier is the proxier process's main function.
func runProxier() int {
	if err := serveProxier(context.Background(), os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "soak proxier:", err)
		return 1
	}
	return 0
}

// emitter writes events, one JSON object a line, from any goroutine.
type emitter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (e *emitter) emit(ev event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.enc.Encode(ev) // the parent is gone when this fails; stdin ends next
}

// logWriter turns the records of a JSON slog handler, one Write each, into
// events.
type logWriter struct{ em *emitter }

func (w logWriter) Write(b []byte) (int, error) {
	w.em.emit(event{Kind: evLog, Log: json.RawMessage(bytes.Clone(bytes.TrimSpace(b)))})
	return len(b), nil
}

// serveProxier runs a Runner in front of the configured backend, fed by
// the commands of in, until in ends.
func serveProxier(ctx context.Context, in io.Reader, out io.Writer) error {
	em := &emitter{enc: json.NewEncoder(out)}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var first command
	if !sc.Scan() {
		return fmt.Errorf("no configuration: %v", sc.Err())
	}
	if err := json.Unmarshal(sc.Bytes(), &first); err != nil || first.Op != opConfig || first.Config == nil {
		return fmt.Errorf("first line is no configuration: %q (%v)", sc.Text(), err)
	}
	cfg := first.Config
	log := slog.New(slog.NewJSONHandler(logWriter{em}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := newBackend(cfg.Backend, netns.NsHandle(nsFD), cfg.VerifyInterval, log)
	if err != nil {
		return err
	}
	defer p.Close()
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{
		Node:   cfg.Node,
		Logger: log,
		Hooks:  servicelb.Hooks{Synced: func(res servicelb.SyncResult) { em.emit(syncEvent(res)) }},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { r.Run(ctx) })
	wg.Go(func() { reportStats(ctx, em) })
	src := r.Source("soak")
	for sc.Scan() {
		var c command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return fmt.Errorf("command %q: %w", sc.Text(), err)
		}
		if err := obey(ctx, &wg, r, src, em, c); err != nil {
			em.emit(event{Kind: evError, Err: err.Error()})
		}
	}
	return sc.Err()
}

// obey carries out one command.
func obey(ctx context.Context, wg *sync.WaitGroup, r *servicelb.Runner, src *servicelb.Source, em *emitter, c command) error {
	switch c.Op {
	case opUpsert:
		if c.Service == nil {
			return errors.New("upsert without a service")
		}
		return src.Upsert(*c.Service)
	case opDelete:
		return src.Delete(c.Name)
	case opSynced:
		src.Synced()
	case opSettle:
		wg.Go(func() { awaitApplied(ctx, r, em, c.Seq) })
	default:
		return fmt.Errorf("unknown command %q", c.Op)
	}
	return nil
}

// awaitApplied reports seq once the Runner has nothing pending and its
// last sync succeeded: everything sent before is in the kernel.
func awaitApplied(ctx context.Context, r *servicelb.Runner, em *emitter, seq int) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		h := r.Health()
		if h.Ready && h.Pending == 0 && h.QueuedAt.IsZero() && h.LastError == nil {
			em.emit(event{Kind: evSettled, Seq: seq})
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func syncEvent(res servicelb.SyncResult) event {
	ev := event{Kind: evSync, Start: res.Start, Duration: res.Duration, Services: res.Services, QueuedAt: res.QueuedAt, Full: res.Full}
	if res.Err != nil {
		ev.Err = res.Err.Error()
	}
	return ev
}

// reportStats reports the goroutines and the live heap (as the last
// garbage collection found it) every statsEvery.
func reportStats(ctx context.Context, em *emitter) {
	tick := time.NewTicker(statsEvery)
	defer tick.Stop()
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	for {
		metrics.Read(live)
		em.emit(event{Kind: evStats, Goroutines: runtime.NumGoroutine(), HeapLive: live[0].Value.Uint64()})
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// proxier is a proxier process as the soak sees it.
type proxier struct {
	id      int // 1, 2, ... in the order started
	cmd     *exec.Cmd
	pid     int
	started time.Time

	mu    sync.Mutex // serialises writes to stdin
	stdin io.WriteCloser

	// expected is set before the soak kills or stops the process, whose
	// exit is then no failure.
	expected atomic.Bool
	// done is closed once the process has exited and its output is read.
	done chan struct{}
	err  error // of Wait, once done
}

// send writes one command to the process.
func (px *proxier) send(c command) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	px.mu.Lock()
	defer px.mu.Unlock()
	_, err = px.stdin.Write(append(b, '\n'))
	return err
}

// kill kills the process with SIGKILL, by its pid, and waits for it.
func (px *proxier) kill() {
	px.expected.Store(true)
	if isDone(px) {
		return
	}
	_ = px.cmd.Process.Signal(syscall.SIGKILL)
	<-px.done
}

// stop closes the process's input, on which it exits, and kills it if it
// has not within timeout.
func (px *proxier) stop(timeout time.Duration) error {
	px.expected.Store(true)
	px.mu.Lock()
	px.stdin.Close()
	px.mu.Unlock()
	select {
	case <-px.done:
		return px.err
	case <-time.After(timeout):
		px.kill()
		return fmt.Errorf("proxier %d (pid %d) did not exit within %v of the end of its input; killed", px.id, px.pid, timeout)
	}
}

// rssKiB reads the process's resident set size from /proc.
func (px *proxier) rssKiB() (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", px.pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// supervisor starts, kills and restarts the proxier processes.
type supervisor struct {
	s *soak
	// mu serialises starts and kills.
	mu      sync.Mutex
	started int
	settles atomic.Int64
	// settled receives the Seq of every evSettled event.
	settled chan int
}

// start starts a proxier process and hands it the whole state.
func (sv *supervisor) start() error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.startLocked()
}

func (sv *supervisor) startLocked() error {
	s := sv.s
	if sv.settled == nil {
		sv.settled = make(chan int, 16)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.ExtraFiles = []*os.File{s.nsFile}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	sv.started++
	px := &proxier{id: sv.started, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	cmd.Stderr = &lineLogger{log: s.t.Logf, prefix: fmt.Sprintf("proxier %d stderr: ", px.id)}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the proxier process: %w", err)
	}
	px.pid, px.started = cmd.Process.Pid, time.Now()
	s.t.Cleanup(px.kill)
	s.led.born(px.id, px.started)
	go sv.read(px, stdout)
	cfg := &proxierConfig{Backend: s.dp.name(), Node: s.node, VerifyInterval: *flagVerify}
	if err := px.send(command{Op: opConfig, Config: cfg}); err != nil {
		px.kill()
		return err
	}
	if err := s.world.attach(px); err != nil {
		px.kill()
		return fmt.Errorf("hand the state to proxier %d: %w", px.id, err)
	}
	s.t.Logf("soak: proxier %d started, pid %d", px.id, px.pid)
	return nil
}

// read handles the events of px until its output ends, then waits for
// it.
func (sv *supervisor) read(px *proxier, stdout io.Reader) {
	s := sv.s
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			s.led.errorf("proxier %d: unreadable output %q: %v", px.id, sc.Text(), err)
			continue
		}
		sv.handle(px, ev)
	}
	// Drain what is left, so that the process never blocks on a full
	// pipe before it exits.
	_, _ = io.Copy(io.Discard, stdout)
	px.err = px.cmd.Wait()
	s.led.died(px.id, time.Now())
	close(px.done)
	if !px.expected.Load() {
		s.led.errorf("proxier %d (pid %d) exited on its own: %v", px.id, px.pid, px.err)
		go sv.replace(px)
	}
}

func (sv *supervisor) handle(px *proxier, ev event) {
	s := sv.s
	now := time.Now()
	switch ev.Kind {
	case evSync:
		if s.led.synced(px.id, now, ev) {
			s.t.Logf("soak: proxier %d: first successful sync at %s, %v after its start", px.id, s.led.since(now), now.Sub(px.started).Round(time.Millisecond))
		}
	case evStats:
		rss, err := px.rssKiB()
		if err != nil {
			return // the process is going away
		}
		s.led.sample(px.id, sample{at: now, rssKiB: rss, goroutines: ev.Goroutines, heapLive: ev.HeapLive})
	case evLog:
		s.t.Logf("proxier %d: %s", px.id, ev.Log)
	case evSettled:
		select {
		case sv.settled <- ev.Seq:
		default:
		}
	case evError:
		s.led.errorf("proxier %d refused a command: %s", px.id, ev.Err)
	default:
		s.led.errorf("proxier %d: unknown event %q", px.id, ev.Kind)
	}
}

// replace starts a new proxier after px exited on its own.
func (sv *supervisor) replace(px *proxier) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.s.world.detach(px) == nil {
		return // already replaced
	}
	if err := sv.startLocked(); err != nil {
		sv.s.led.errorf("restart after proxier %d exited: %v", px.id, err)
	}
}

// restart kills the running proxier, waits pause, and starts a new one.
func (sv *supervisor) restart(pause time.Duration) error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	s := sv.s
	px, _ := s.world.detach(nil).(*proxier)
	if px != nil {
		px.kill()
		s.t.Logf("soak: fault restart at %s: proxier %d (pid %d) killed after %v; next in %v",
			s.led.since(time.Now()), px.id, px.pid, time.Since(px.started).Round(time.Second), pause.Round(time.Millisecond))
	}
	s.led.restarted()
	time.Sleep(pause)
	return sv.startLocked()
}

// settle waits until the running proxier has applied every change sent
// so far; if that proxier exits first, it asks the next one.
func (sv *supervisor) settle(timeout time.Duration) error {
	seq := int(sv.settles.Add(1))
	deadline := time.After(timeout)
	for {
		px, _ := sv.s.world.running().(*proxier)
		if px == nil {
			select {
			case <-deadline:
				return fmt.Errorf("no proxier ran for %v", timeout)
			case <-time.After(100 * time.Millisecond):
				continue
			}
		}
		if err := px.send(command{Op: opSettle, Seq: seq}); err != nil {
			<-px.done
			continue
		}
		if err := sv.awaitSettled(px, seq, deadline); err != nil {
			return err
		}
		if !isDone(px) {
			return nil
		}
	}
}

// awaitSettled waits for px to report seq, or to exit, or for deadline.
func (sv *supervisor) awaitSettled(px *proxier, seq int, deadline <-chan time.Time) error {
	for {
		select {
		case got := <-sv.settled:
			if got == seq {
				return nil
			}
		case <-px.done:
			return nil
		case <-deadline:
			return fmt.Errorf("proxier %d has not applied the changes sent to it in time", px.id)
		}
	}
}

// isDone reports whether px has exited.
func isDone(px *proxier) bool {
	select {
	case <-px.done:
		return true
	default:
		return false
	}
}

// stop ends the running proxier by closing its input.
func (sv *supervisor) stop() {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if px, _ := sv.s.world.detach(nil).(*proxier); px != nil {
		if err := px.stop(30 * time.Second); err != nil {
			sv.s.led.errorf("stop proxier %d: %v", px.id, err)
		}
	}
}

// lineLogger logs what a process writes, a line at a time.
type lineLogger struct {
	log    func(format string, args ...any)
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (l *lineLogger) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		l.log("%s%s", l.prefix, l.buf[:i])
		l.buf = l.buf[i+1:]
	}
}
