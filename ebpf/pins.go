//go:build linux

package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// RemovePins removes what Proxiers with Options.PinPath pinPath left in
// the kernel when none of them runs any more: the pins of their links,
// which detaches their hooks once no process holds the links, the pins of
// their maps, and then the directory when nothing else is in it. It is
// Cleanup for a process that holds no Proxier, such as an agent's
// clean-up-and-exit mode: it needs no cgroup, loads no program and
// probes nothing. Files it did not make are left alone; a pinPath that
// does not exist holds nothing to remove. A process that still runs a
// Proxier with its links open keeps its hooks attached until it closes
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
	names = append(names, mapNamesInOrder...)
	var errs []error
	for _, n := range names {
		if err := os.Remove(filepath.Join(pinPath, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", n, err))
		}
	}
	if err := os.Remove(pinPath); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ebpf: remove pins: %w", err)
	}
	return nil
}
