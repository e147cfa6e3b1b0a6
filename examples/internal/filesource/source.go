package filesource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Source feeds the services of a file to a runner and follows the file's
// changes. A change that does not parse is reported and changes nothing; a
// service that is invalid is reported and keeps its last good version (or
// stays absent), while the other services are applied. A file emptied,
// or without a services key, keeps the last good state with a warning
// (an editor's or a deploy tool's half-written file must not withdraw
// every service): only "services: []" removes them all. The file must be
// a regular file (a symbolic link to one is followed, as in a ConfigMap's
// volume) of at most MaxBytes: anything else is refused, never read.
type Source struct {
	// Path is the file.
	Path string
	// MaxBytes bounds the file's size; zero means DefaultMaxBytes.
	MaxBytes int64
	// Logger receives what changed; nil discards.
	Logger *slog.Logger
	// Debounce is how long the file must be quiet before it is read after
	// a change; default 100ms.
	Debounce time.Duration

	good map[string]servicelb.Service // last good version of each service
}

var _ agent.Source = (*Source)(nil)

// DefaultMaxBytes is the largest services file read by default: 64 MiB,
// some 200,000 services.
const DefaultMaxBytes = 64 << 20

// Name returns "file".
func (s *Source) Name() string { return "file" }

// Run loads the file, then watches it until ctx ends. A first load that
// fails as a whole is returned as the error.
func (s *Source) Run(ctx context.Context, dst *servicelb.Source, report agent.Reporter) error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", s.Path, err)
	}
	defer w.Close()
	// Watch the directory: editors replace files by renaming over them.
	if err := w.Add(filepath.Dir(s.Path)); err != nil {
		return fmt.Errorf("watch %s: %w", s.Path, err)
	}
	if err := s.load(dst, report); err != nil {
		return err
	}
	dst.Synced()
	return s.watch(ctx, w, dst, report)
}

func (s *Source) watch(ctx context.Context, w *fsnotify.Watcher, dst *servicelb.Source, report agent.Reporter) error {
	debounce := s.Debounce
	if debounce <= 0 {
		debounce = 100 * time.Millisecond
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	name := filepath.Clean(s.Path)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("file watcher closed")
			}
			if filepath.Clean(ev.Name) == name {
				timer.Reset(debounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("file watcher closed")
			}
			s.Logger.Warn("file watcher", "err", err)
		case <-timer.C:
			if err := s.load(dst, report); err != nil {
				report(s.Path, fmt.Errorf("%w (keeping the last good state)", err))
			}
		}
	}
}

// load reads and applies the file. A whole-file error is returned with
// nothing applied; problems of single services are reported.
func (s *Source) load(dst *servicelb.Source, report agent.Reporter) error {
	data, err := s.read()
	if err != nil {
		return fmt.Errorf("read services: %w", err)
	}
	p, err := Parse(s.Path, data)
	if err != nil {
		return err
	}
	if !p.Stated && len(s.good) > 0 {
		s.Logger.Warn("the services file states no services (empty, or no services key): keeping the last good state; write \"services: []\" to remove them all",
			"file", s.Path, "services", len(s.good))
		return nil
	}
	svcs := p.Services
	for name, err := range p.Bad {
		report(name, err)
		if old, ok := s.good[name]; ok {
			svcs = append(svcs, old) // keep the last good version
		}
	}
	applyErr := p.Locate(dst.Replace(svcs))
	bad := ByService(applyErr)
	for name, err := range bad {
		report(name, err)
	}
	next := map[string]servicelb.Service{}
	for _, svc := range svcs {
		if _, failed := bad[svc.Name]; failed {
			if old, ok := s.good[svc.Name]; ok {
				next[svc.Name] = old
			}
			continue
		}
		next[svc.Name] = svc
	}
	added, changed, removed := difference(s.good, next)
	s.Logger.Info("loaded services", "file", s.Path, "services", len(next), "invalid", len(p.Bad)+len(bad),
		"added", len(added), "changed", len(changed), "removed", len(removed),
		"addedNames", sample(added), "changedNames", sample(changed), "removedNames", sample(removed))
	s.good = next
	return nil
}

// read reads the file, if it is a regular file of at most MaxBytes. It is
// opened without blocking, so that a FIFO put in its place never stalls
// the source, and checked again once open.
func (s *Source) read() ([]byte, error) {
	limit := cmp.Or(s.MaxBytes, DefaultMaxBytes)
	fi, err := os.Stat(s.Path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", s.Path, fi.Mode().Type())
	}
	f, err := os.OpenFile(s.Path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", s.Path, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", s.Path, limit)
	}
	return data, nil
}

// sampleSize is how many names a log line lists of a kind of change: a
// file of thousands of services logs counts, not every name.
const sampleSize = 5

// sample returns the first names of a sorted list, and how many more
// there are.
func sample(names []string) string {
	if len(names) <= sampleSize {
		return strings.Join(names, " ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:sampleSize], " "), len(names)-sampleSize)
}

// difference names the services added, changed and removed from old to
// cur, sorted.
func difference(old, cur map[string]servicelb.Service) (added, changed, removed []string) {
	for name, svc := range cur {
		o, ok := old[name]
		switch {
		case !ok:
			added = append(added, name)
		case !reflect.DeepEqual(o, svc):
			changed = append(changed, name)
		}
	}
	for name := range old {
		if _, ok := cur[name]; !ok {
			removed = append(removed, name)
		}
	}
	slices.Sort(added)
	slices.Sort(changed)
	slices.Sort(removed)
	return added, changed, removed
}
