//go:build linux

package ebpf

import (
	"os"
	"path/filepath"
)

// hooked reports whether every hook is still attached to the cgroup: one
// syscall a hook.
func (k *engine) hooked() bool {
	for i, l := range k.links {
		if l == nil || !(*Proxier)(k).attached(l, hooks[i]) {
			k.log.Info("hook detached by someone else", "hook", hooks[i].name)
			return false
		}
	}
	return true
}

// pinned reports whether, with a PinPath, every map and link is pinned
// there.
func (k *engine) pinned() bool {
	if k.opts.PinPath == "" {
		return true
	}
	for _, name := range mapNamesInOrder {
		if _, err := os.Stat(filepath.Join(k.mapDir, name)); err != nil {
			k.log.Info("pin removed by someone else", "map", name)
			return false
		}
	}
	for _, h := range hooks {
		if _, err := os.Stat((*Proxier)(k).linkPin(h)); err != nil {
			k.log.Info("pin removed by someone else", "hook", h.name)
			return false
		}
	}
	return true
}
