package servicelb

import (
	"maps"
	"slices"
)

// serviceMap is the services of a State or Builder by name: a base map and
// an overlay of the changes made since the base was last shared with a
// State (a nil entry marks a service deleted from the base). States taken
// from one Builder share their base until the overlay grows past about
// twice the square root of the number of services; so a change costs a
// copy of the overlay at most once per snapshot instead of a copy of every
// service, and Diff of two States on one base reads only their overlays, or
// only the names set between them when one journal holds both.
type serviceMap struct {
	base *baseMap
	over map[string]*entry
	n    int
	// names are the services set, in order, since journal began (when the
	// writer first shared its base): each later map of the same writer
	// extends them, so two maps with one journal differ by the names
	// past the shorter's. The writer appends to its own copy of the
	// slice, past the length of every copy a State took, so a State's
	// names never change.
	journal *journal
	names   []string
}

// journal identifies one writer's run of names; it is not empty, so that
// two journals never share an address.
type journal struct{ _ byte }

// baseMap is a pointer so that two serviceMaps can tell that they share it.
type baseMap struct{ m map[string]*entry }

func (s *serviceMap) get(name string) *entry {
	if e, ok := s.over[name]; ok {
		return e
	}
	if s.base == nil {
		return nil
	}
	return s.base.m[name]
}

// each calls f for every service, in no particular order.
func (s *serviceMap) each(f func(name string, e *entry)) {
	if s.base != nil {
		for name, e := range s.base.m {
			if _, ok := s.over[name]; !ok {
				f(name, e)
			}
		}
	}
	for name, e := range s.over {
		if e != nil {
			f(name, e)
		}
	}
}

// sameBase reports whether s and t differ only by their overlays.
func (s *serviceMap) sameBase(t *serviceMap) bool {
	return s.base != nil && s.base == t.base
}

// changedNames returns the names whose entries may differ between s and t,
// which share a base, each once: those set between them when one journal
// holds both, else those in either overlay.
func (s *serviceMap) changedNames(t *serviceMap) []string {
	if s.journal != nil && s.journal == t.journal {
		short, long := s.names, t.names
		if len(short) > len(long) {
			short, long = long, short
		}
		names := long[len(short):]
		if len(names) > 1 {
			names = slices.Compact(slices.Sorted(slices.Values(names)))
		}
		return names
	}
	names := make([]string, 0, len(s.over)+len(t.over))
	for name := range s.over {
		names = append(names, name)
	}
	for name := range t.over {
		if _, ok := s.over[name]; !ok {
			names = append(names, name)
		}
	}
	return names
}

// mapWriter is a Builder's writable serviceMap. While the base is its own
// (a new Builder, or after compaction) changes go straight into it; once a
// State shares the base they go into the overlay, itself copied on the first
// write after a State shares it.
type mapWriter struct {
	serviceMap
	baseShared, overShared bool
}

func newMapWriter() mapWriter {
	return mapWriter{serviceMap: serviceMap{base: &baseMap{m: map[string]*entry{}}}}
}

// share marks the map as held by a State: later writes copy before they
// change anything the State can see. The first share of a base begins
// its journal.
func (w *mapWriter) share() {
	if w.journal == nil {
		w.journal, w.names = &journal{}, nil
	}
	w.baseShared, w.overShared = true, true
}

// fork makes w a writer of its own over a map a State holds: its journal
// goes its own way from there (the State's writer may still extend the
// one they share).
func (w *mapWriter) fork() {
	w.journal, w.names = nil, nil
	w.share()
}

// set adds or replaces, or with a nil e deletes, the named service.
func (w *mapWriter) set(name string, e *entry) {
	had := w.get(name) != nil
	switch {
	case had && e == nil:
		w.n--
	case !had && e != nil:
		w.n++
	}
	if !w.baseShared {
		if e == nil {
			delete(w.base.m, name)
		} else {
			w.base.m[name] = e
		}
		return
	}
	if w.overShared || w.over == nil {
		w.over = maps.Clone(w.over)
		if w.over == nil {
			w.over = map[string]*entry{}
		}
		w.overShared = false
	}
	if _, inBase := w.base.m[name]; e == nil && !inBase {
		delete(w.over, name)
	} else {
		w.over[name] = e
	}
	if len(w.over) > overlayLimit(w.n) {
		w.compact()
		return
	}
	if w.journal != nil {
		if len(w.names) >= journalLimit(w.n) {
			// Bounded like the overlay: a new journal, which Diff
			// does not read across.
			w.journal, w.names = &journal{}, nil
		}
		w.names = append(w.names, name)
	}
}

// compact folds the overlay into a base of the writer's own.
func (w *mapWriter) compact() {
	m := make(map[string]*entry, w.n)
	w.each(func(name string, e *entry) { m[name] = e })
	w.base, w.over = &baseMap{m: m}, nil
	w.baseShared, w.overShared = false, false
	w.journal, w.names = nil, nil
}

// journalLimit bounds a journal of a map of n services: a few times the
// overlay's limit, which changes to a few services never reach.
func journalLimit(n int) int { return 4 * overlayLimit(n) }

// overlayLimit bounds the overlay of a map of n services: about 2√n, so
// that copying the overlay once per snapshot and compacting once per limit
// changes both cost O(√n) per change.
func overlayLimit(n int) int {
	l := 64
	for l*l < 4*n {
		l *= 2
	}
	return l
}
