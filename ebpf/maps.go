//go:build linux

package ebpf

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// kmaps are the Proxier's BPF maps.
type kmaps struct {
	fe, sets, slots, members, affinity, reverse, cfg, names, flows *ebpf.Map
}

func (k *kmaps) all() []*ebpf.Map {
	return []*ebpf.Map{k.fe, k.sets, k.slots, k.members, k.affinity, k.reverse, k.cfg, k.names, k.flows}
}

func (k *kmaps) byName() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{mapFrontends: k.fe, mapSets: k.sets, mapSlots: k.slots, mapMembers: k.members,
		mapAffinity: k.affinity, mapReverse: k.reverse, mapConfig: k.cfg, mapNames: k.names, mapFlows: k.flows}
}

func (k *kmaps) close() {
	for _, m := range k.all() {
		if m != nil {
			m.Close()
		}
	}
}

// openMaps creates the maps, or, with a pin directory (pinDir, the
// layout's directory under the Options.PinPath pinPath), opens those
// pinned there by an earlier process (and creates and pins the others). A
// pinned map it cannot read is a *PinError: the Proxier never deletes
// such a map.
func openMaps(specs map[string]*ebpf.MapSpec, pinDir, pinPath string) (*kmaps, error) {
	got := map[string]*ebpf.Map{}
	fail := func(err error) (*kmaps, error) {
		for _, m := range got {
			m.Close()
		}
		return nil, err
	}
	for _, name := range mapNamesInOrder {
		spec := specs[name].Copy()
		var opts ebpf.MapOptions
		if pinDir != "" {
			spec.Pinning = ebpf.PinByName
			opts.PinPath = pinDir
		}
		m, err := ebpf.NewMapWithOptions(spec, opts)
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return fail(&PinError{Path: filepath.Join(pinDir, name), PinPath: pinPath, Err: err})
		}
		if err != nil {
			return fail(fmt.Errorf("map %s: %w", name, err))
		}
		got[name] = m
	}
	return &kmaps{fe: got[mapFrontends], sets: got[mapSets], slots: got[mapSlots], members: got[mapMembers],
		affinity: got[mapAffinity], reverse: got[mapReverse], cfg: got[mapConfig], names: got[mapNames], flows: got[mapFlows]}, nil
}

// unpin removes the maps' pins.
func (k *kmaps) unpin() error {
	var errs []error
	for name, m := range k.byName() {
		if err := m.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin map %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// batchSize is how many entries one batch syscall carries.
const batchSize = 4096

// readAll reads every entry of a hash map.
func readAll[K comparable, V any](m *ebpf.Map) (map[K]V, error) {
	out := map[K]V{}
	keys, vals := make([]K, batchSize), make([]V, batchSize)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			out[keys[i]] = vals[i]
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return out, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			return iterate[K, V](m)
		case err != nil:
			return nil, fmt.Errorf("read map %s: %w", m.String(), err)
		}
	}
}

func iterate[K comparable, V any](m *ebpf.Map) (map[K]V, error) {
	out := map[K]V{}
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read map %s: %w", m.String(), err)
	}
	return out, nil
}

// read reads what the maps hold.
func (k *kmaps) read() (*content, error) {
	c := &content{}
	var err error
	if c.fe, err = readAll[feKey, feVal](k.fe); err != nil {
		return nil, err
	}
	if c.sets, err = readAll[uint32, setVal](k.sets); err != nil {
		return nil, err
	}
	if c.slots, err = readAll[slotKey, endpoint](k.slots); err != nil {
		return nil, err
	}
	if c.members, err = readAll[memberKey, uint32](k.members); err != nil {
		return nil, err
	}
	if c.names, err = readAll[uint32, nameVal](k.names); err != nil {
		return nil, err
	}
	if err := k.cfg.Lookup(uint32(0), &c.cfg); err != nil {
		return nil, fmt.Errorf("read map %s: %w", mapConfig, err)
	}
	return c, nil
}

// readHooks reads what the hooks wrote in the LRU maps, bounded by
// sizes.
func (k *kmaps) readHooks(sizes Sizes) (*hookContent, error) {
	h := &hookContent{sizes: sizes}
	var err error
	if h.affinity, err = readAll[affKey, affVal](k.affinity); err != nil {
		return nil, err
	}
	if h.reverse, err = readAll[revKey, endpoint](k.reverse); err != nil {
		return nil, err
	}
	if h.flows, err = readAll[affKey, affVal](k.flows); err != nil {
		return nil, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, err
	}
	h.now = uint64(ts.Nano())
	return h, nil
}

// mapWriter is what writing a map takes: an *ebpf.Map, whose every
// call is one syscall.
type mapWriter interface {
	Put(key, value any) error
	BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error)
	Delete(key any) error
	BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error)
	String() string
}

// put writes entries: one syscall for one, batches for more.
func put[K comparable, V any](m mapWriter, entries map[K]V) error {
	if len(entries) == 0 {
		return nil
	}
	keys := slices.Collect(maps.Keys(entries))
	if len(keys) == 1 {
		// Pointers: cilium/ebpf passes their memory as it is, where a
		// value would be encoded by reflection.
		k, v := keys[0], entries[keys[0]]
		if err := m.Put(&k, &v); err != nil {
			return fmt.Errorf("write map %s: %w", m.String(), err)
		}
		return nil
	}
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), batchSize)]
		keys = keys[len(chunk):]
		vals := make([]V, len(chunk))
		for i, key := range chunk {
			vals[i] = entries[key]
		}
		if _, err := m.BatchUpdate(chunk, vals, nil); err != nil {
			return fmt.Errorf("write map %s: %w", m.String(), err)
		}
	}
	return nil
}

// del deletes entries; one already gone is no error.
func del[K comparable](m mapWriter, keys []K) error {
	if len(keys) == 1 {
		if err := m.Delete(&keys[0]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from map %s: %w", m.String(), err)
		}
		return nil
	}
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), batchSize)]
		keys = keys[len(chunk):]
		if _, err := m.BatchDelete(chunk, nil); err != nil {
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete from map %s: %w", m.String(), err)
			}
			// A batch stops at the first key that is gone: delete the
			// rest one by one.
			for _, key := range chunk {
				if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return fmt.Errorf("delete from map %s: %w", m.String(), err)
				}
			}
		}
	}
	return nil
}

// write applies a delta to the maps, step by step (see delta.run). It
// stops at the first error: the next sync writes the whole content.
func (k *kmaps) write(d *delta) error {
	return d.run(&writers{fe: k.fe, sets: k.sets, slots: k.slots, members: k.members, names: k.names, cfg: k.cfg}, nil)
}

// writers are the maps a delta writes, as the sink of its steps.
type writers struct {
	fe, sets, slots, members, names, cfg mapWriter
}

func (w *writers) delMembers(keys []memberKey) error       { return del(w.members, keys) }
func (w *writers) putMembers(m map[memberKey]uint32) error { return put(w.members, m) }
func (w *writers) putSlots(m map[slotKey]endpoint) error   { return put(w.slots, m) }
func (w *writers) putSets(m map[uint32]setVal) error       { return put(w.sets, m) }
func (w *writers) putNames(m map[uint32]nameVal) error     { return put(w.names, m) }
func (w *writers) putFE(m map[feKey]feVal) error           { return put(w.fe, m) }
func (w *writers) delFE(keys []feKey) error                { return del(w.fe, keys) }
func (w *writers) delSets(keys []uint32) error             { return del(w.sets, keys) }
func (w *writers) delNames(keys []uint32) error            { return del(w.names, keys) }
func (w *writers) delSlots(keys []slotKey) error           { return del(w.slots, keys) }

func (w *writers) putCfg(v cfgVal) error {
	if err := w.cfg.Put(uint32(0), v); err != nil {
		return fmt.Errorf("write map %s: %w", mapConfig, err)
	}
	return nil
}
