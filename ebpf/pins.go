//go:build linux

package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cilium/ebpf/link"
)

// Under Options.PinPath a Proxier pins its links as "link_<hook>" and its
// maps ("kp_*") in a directory named after their layout (mapDirPrefix and
// layoutName). Versions before layouts had names pinned their maps in
// PinPath itself.

// RemovePins removes what Proxiers with Options.PinPath pinPath left in
// the kernel when none of them runs any more: the pins of their links,
// which detaches their hooks once no process holds the links, the pins of
// their maps of every layout, and then the directories when nothing else
// is in them. It is Cleanup for a process that holds no Proxier, such as
// an agent's clean-up-and-exit mode: it needs no cgroup, loads no program
// and probes nothing. Files it did not make are left alone; a pinPath
// that does not exist holds nothing to remove. A process that still runs
// a Proxier with its links open keeps its hooks attached until it closes
// them.
func RemovePins(pinPath string) error {
	if pinPath == "" {
		return nil
	}
	if _, err := os.Stat(pinPath); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var names []string
	for _, h := range hooks {
		names = append(names, "link_"+h.name)
	}
	errs := []error{removeFiles(pinPath, names), removeMapPins(pinPath, "")}
	errs = append(errs, removeEmpty(pinPath))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ebpf: remove pins: %w", err)
	}
	return nil
}

// retireLayouts removes the pins of the maps of other layouts under
// PinPath, once every hook runs this process's programs, which read this
// layout's maps only: what an earlier version pinned in PinPath itself,
// and every other layout's directory. Until then the hooks an earlier
// process attached keep balancing with its maps, which this process never
// writes, so an upgrade leaves no socket unbalanced or misread. The
// hooks' own entries (affinity pins, reverse translations) are not
// carried over: a client's next flow may pick another endpoint, and a
// UDP socket connected before the upgrade shows its endpoint's address
// to getpeername and recvmsg.
func (p *Proxier) retireLayouts() error {
	err := removeMapPins(p.opts.PinPath, p.mapDir)
	if err == nil {
		p.log.Debug("pins of other map layouts removed", "layout", filepath.Base(p.mapDir))
	}
	return err
}

// removeMapPins removes the map pins in dir itself and in each layout
// directory under it but keep, and those directories when empty.
func removeMapPins(dir, keep string) error {
	errs := []error{removeFiles(dir, mapNamesInOrder)}
	layouts, err := filepath.Glob(filepath.Join(dir, mapDirPrefix+"*"))
	errs = append(errs, err)
	for _, d := range layouts {
		if d == keep {
			continue
		}
		errs = append(errs, removeFiles(d, mapNamesInOrder), removeEmpty(d))
	}
	return errors.Join(errs...)
}

// removeFiles removes the named files of dir that exist.
func removeFiles(dir string, names []string) error {
	var errs []error
	for _, n := range names {
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// removeEmpty removes dir when it exists and holds nothing.
func removeEmpty(dir string) error {
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return err
	}
	return nil
}

// pinMaps pins the maps whose pins are missing (after a Cleanup, or
// removed by someone else).
func (p *Proxier) pinMaps() error {
	if err := os.MkdirAll(p.mapDir, 0o700); err != nil {
		return fmt.Errorf("pin path: %w", err)
	}
	for name, m := range p.maps.byName() {
		if err := repin(m, filepath.Join(p.mapDir, name)); err != nil {
			return fmt.Errorf("pin map %s: %w", name, err)
		}
	}
	return nil
}

// pinner is a map or a link.
type pinner interface {
	Pin(string) error
	Unpin() error
}

// repin pins o at path unless a file is there. An object remembers the
// path it was pinned at and takes a Pin to it again for done: Unpin
// first makes it forget a pin someone else removed (the file is gone,
// so Unpin removes nothing).
func repin(o pinner, path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := o.Unpin(); err != nil {
		return err
	}
	if err := o.Pin(path); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

func (p *Proxier) pinLink(l link.Link, h hook) error {
	if p.opts.PinPath == "" {
		return nil
	}
	if err := repin(l, p.linkPin(h)); err != nil {
		return fmt.Errorf("pin link %s: %w", h.name, err)
	}
	return nil
}
