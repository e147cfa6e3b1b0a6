package servicelb

// serviceMap is the services of a State or Builder by name, in a pmap that
// the States of a Builder share with it.
type serviceMap struct {
	pmap[string, *entry]
}

func (s *serviceMap) get(name string) *entry {
	e, _ := s.pmap.get(name)
	return e
}

// mapWriter is a Builder's writable serviceMap: it changes in place the
// nodes it made since it last shared the map with a State, and copies
// the others.
type mapWriter struct {
	serviceMap
	o *owner
}

func newMapWriter() mapWriter { return mapWriter{o: &owner{}} }

// share marks the map as held by a State: later writes copy the nodes
// they change.
func (w *mapWriter) share() { w.o = &owner{} }

// set adds or replaces, or with a nil e deletes, the named service.
func (w *mapWriter) set(name string, e *entry) {
	if e == nil {
		w.delete(w.o, name)
		return
	}
	w.pmap.set(w.o, name, e)
}
