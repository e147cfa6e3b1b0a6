package filesource

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

type reports struct {
	mu  sync.Mutex
	got []string
}

func (r *reports) report(object string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, object+": "+err.Error())
}

func (r *reports) find(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.got {
		if strings.Contains(g, sub) {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func endpointsOf(p *fake.Proxier, name string) string {
	st := p.Applied()
	if st == nil {
		return "<none>"
	}
	svc, ok := st.Service(name)
	if !ok {
		return "<absent>"
	}
	var out []string
	for _, e := range svc.Endpoints {
		out = append(out, e.Addr.String())
	}
	return strings.Join(out, ",")
}

const (
	fileV1 = `services:
  - name: a
    clusterIPs: [10.96.0.1]
    ports: [{port: 80}]
    endpoints: [{addr: 10.1.0.1}]
  - name: b
    clusterIPs: [10.96.0.2]
    ports: [{port: 80}]
    endpoints: [{addr: 10.2.0.1}]
`
	fileV2 = `services:
  - name: a
    clusterIPs: [10.96.0.1]
    ports: [{port: 80}]
    endpoints: [{addr: 10.1.0.1}, {addr: 10.1.0.2}]
  - name: b
    clusterIPs: [10.96.0.2]
    ports: [{port: 80}]
    endpoints: [{addr: 10.2.0.1}]
`
	fileBroken = "services:\n  - name: a\n    ports: [\n"
	// b is invalid (port 0); a changes.
	fileBadB = `services:
  - name: a
    clusterIPs: [10.96.0.1]
    ports: [{port: 80}]
    endpoints: [{addr: 10.1.0.3}]
  - name: b
    clusterIPs: [10.96.0.2]
    ports: [{port: 0}]
    endpoints: [{addr: 10.2.0.9}]
`
	fileOnlyB = `services:
  - name: b
    clusterIPs: [10.96.0.2]
    ports: [{port: 80}]
    endpoints: [{addr: 10.2.0.2}]
`
)

// The source applies the file, follows its edits, applies only what
// changed, reports an invalid edit and keeps the last good state.
func TestSourceFollowsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	write := func(s string) {
		t.Helper()
		// Replace the file as editors do: write beside it and rename.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(fileV1)
	p := &fake.Proxier{}
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{MinSyncInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { _ = r.Run(ctx) })
	rep := &reports{}
	src := &Source{Path: path, Debounce: 20 * time.Millisecond}
	wg.Go(func() {
		if err := src.Run(ctx, r.Source(src.Name()), rep.report); err != nil {
			t.Error(err)
		}
	})
	waitFor(t, "first apply", func() bool { return endpointsOf(p, "a") == "10.1.0.1" && endpointsOf(p, "b") == "10.2.0.1" })

	write(fileV2)
	waitFor(t, "edit applied", func() bool { return endpointsOf(p, "a") == "10.1.0.1,10.1.0.2" })
	recs := p.Records()
	last := recs[len(recs)-1].Changes
	if last.Len() != 1 || len(last.Changed) != 1 || last.Changed[0].New.Key.Service != "a" {
		t.Errorf("edit of a synced %+v, want only a's port changed", last)
	}

	write(fileBroken)
	waitFor(t, "syntax error reported", func() bool { return rep.find(path + ":3: did not find expected node content") })
	if got := endpointsOf(p, "a"); got != "10.1.0.1,10.1.0.2" {
		t.Errorf("after a broken edit a has %s, want the last good state", got)
	}

	write(fileBadB)
	waitFor(t, "a's change applied", func() bool { return endpointsOf(p, "a") == "10.1.0.3" })
	// The Runner refuses b as the source hands the file over, and the
	// report follows; a's change may be synced in between.
	waitFor(t, "invalid b reported with its line and field", func() bool {
		return rep.find(path + `:8: service "b": ports[0].port: 0: invalid port`)
	})
	if got := endpointsOf(p, "b"); got != "10.2.0.1" {
		t.Errorf("invalid edit of b: b has %s, want its last good version 10.2.0.1", got)
	}

	write(fileOnlyB)
	waitFor(t, "a removed, b fixed", func() bool { return endpointsOf(p, "a") == "<absent>" && endpointsOf(p, "b") == "10.2.0.2" })
}

// A file that fails as a whole at start is an error.
func TestSourceBadStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(path, []byte(fileBroken), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := servicelb.NewRunner(&fake.Proxier{}, servicelb.RunnerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src := &Source{Path: path}
	err = src.Run(context.Background(), r.Source("file"), func(string, error) {})
	if err == nil || !strings.Contains(err.Error(), path+":3:") {
		t.Errorf("Run = %v, want the file's line", err)
	}
}

func TestDifference(t *testing.T) {
	a := servicelb.Service{Name: "a", Ports: []servicelb.Port{{Port: 80}}}
	a2 := servicelb.Service{Name: "a", Ports: []servicelb.Port{{Port: 81}}}
	b := servicelb.Service{Name: "b"}
	c := servicelb.Service{Name: "c"}
	added, changed, removed := difference(
		map[string]servicelb.Service{"a": a, "b": b},
		map[string]servicelb.Service{"a": a2, "c": c})
	if strings.Join(added, ",") != "c" || strings.Join(changed, ",") != "a" || strings.Join(removed, ",") != "b" {
		t.Errorf("difference = %v %v %v", added, changed, removed)
	}
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A file of 5,000 services is logged as counts and a few names, not one
// line that names every service.
func TestLoadLogIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("services:\n")
	for i := range 5000 {
		fmt.Fprintf(&b, "  - name: svc-%04d\n    clusterIPs: [10.96.%d.%d]\n    ports: [{port: 80}]\n    endpoints: [{addr: 10.1.0.1}]\n",
			i, i/250, i%250+1)
	}
	path := filepath.Join(t.TempDir(), "services.yaml")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	var logs syncBuffer
	src := &Source{Path: path, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	p := &fake.Proxier{}
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{})
	require.NoError(t, err)
	require.NoError(t, src.load(r.Source(src.Name()), func(o string, err error) { t.Errorf("%s: %v", o, err) }))
	out := logs.String()
	require.Contains(t, out, "loaded services")
	assert.Contains(t, out, "services=5000")
	assert.Contains(t, out, "added=5000")
	assert.Contains(t, out, `addedNames="svc-0000 svc-0001 svc-0002 svc-0003 svc-0004 and 4995 more"`)
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		assert.Less(t, len(line), 512, "log line of %d bytes", len(line))
	}
}

// An emptied file, or one without a services key, keeps the last good
// state with a warning; "services: []" states the empty set and removes
// every service.
func TestSourceEmptiedFileKeepsState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	require.NoError(t, os.WriteFile(path, []byte(fileV1), 0o644))
	var logs syncBuffer
	src := &Source{Path: path, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	p := &fake.Proxier{}
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{})
	require.NoError(t, err)
	dst := r.Source(src.Name())
	noReport := func(o string, err error) { t.Errorf("%s: %v", o, err) }
	require.NoError(t, src.load(dst, noReport))
	require.Len(t, src.good, 2)
	for _, doc := range []string{"", "\n", "# every service moved elsewhere\n", "{}\n"} {
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
		require.NoError(t, src.load(dst, noReport))
		assert.Len(t, src.good, 2, "after %q", doc)
		assert.Equal(t, 2, r.State().Len(), "after %q", doc)
	}
	assert.Contains(t, logs.String(), `write \"services: []\" to remove them all`)
	require.NoError(t, os.WriteFile(path, []byte("services: []\n"), 0o644))
	require.NoError(t, src.load(dst, noReport))
	assert.Empty(t, src.good)
	assert.Equal(t, 0, r.State().Len())
}

// The file must be a regular file of a bounded size: a FIFO is refused at
// once (never opened to wait for a writer), a device is never read, and a
// file above MaxBytes is refused; each keeps the last good state.
func TestSourceReadsOnlyRegularFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "services.yaml")
	require.NoError(t, os.WriteFile(path, []byte(fileV1), 0o644))
	src := &Source{Path: path, MaxBytes: int64(len(fileV1)), Logger: slog.New(slog.DiscardHandler)}
	r, err := servicelb.NewRunner(&fake.Proxier{}, servicelb.RunnerOptions{})
	require.NoError(t, err)
	dst := r.Source(src.Name())
	require.NoError(t, src.load(dst, func(string, error) {}))

	require.NoError(t, os.WriteFile(path, []byte(fileV1+"\n# one byte too many"), 0o644))
	assert.ErrorContains(t, src.load(dst, func(string, error) {}), "larger than")

	require.NoError(t, os.Remove(path))
	require.NoError(t, syscall.Mkfifo(path, 0o644))
	done := make(chan error, 1)
	go func() { done <- src.load(dst, func(string, error) {}) }()
	select {
	case err := <-done:
		assert.ErrorContains(t, err, "not a regular file")
	case <-time.After(5 * time.Second):
		t.Fatal("a FIFO blocked the load")
	}

	require.NoError(t, os.Remove(path))
	require.NoError(t, os.Symlink("/dev/zero", path))
	assert.ErrorContains(t, src.load(dst, func(string, error) {}), "not a regular file")
	assert.Equal(t, 2, r.State().Len(), "the last good state kept")

	// A symbolic link to a regular file, as a ConfigMap volume has, is
	// read.
	require.NoError(t, os.Remove(path))
	real := filepath.Join(dir, "..data")
	require.NoError(t, os.WriteFile(real, []byte(fileV2), 0o644))
	require.NoError(t, os.Symlink(real, path))
	src.MaxBytes = 0
	require.NoError(t, src.load(dst, func(string, error) {}))
}
