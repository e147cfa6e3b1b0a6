package servicelb

import "maps"

// serviceMap is the services of a State or Builder by name: a base map and
// an overlay of the changes made since the base was last shared with a
// State (a nil entry marks a service deleted from the base). States taken
// from one Builder share their base until the overlay grows past about
// twice the square root of the number of services; so a change costs a
// copy of the overlay at most once per snapshot instead of a copy of every
// service, and Diff of two States on one base reads only their overlays.
type serviceMap struct {
	base *baseMap
	over map[string]*entry
	n    int
}

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
// which share a base: those in either overlay.
func (s *serviceMap) changedNames(t *serviceMap) []string {
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
// change anything the State can see.
func (w *mapWriter) share() { w.baseShared, w.overShared = true, true }

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
	}
}

// compact folds the overlay into a base of the writer's own.
func (w *mapWriter) compact() {
	m := make(map[string]*entry, w.n)
	w.each(func(name string, e *entry) { m[name] = e })
	w.base, w.over = &baseMap{m: m}, nil
	w.baseShared, w.overShared = false, false
}

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
