//go:build linux

package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
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
