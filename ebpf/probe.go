//go:build linux

package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// probeFS checks that path is a directory on a filesystem of the given
// magic number.
func probeFS(path string, magic int64, feature, hint string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s %s: %w", feature, path, err)
		}
		return &FeatureError{Feature: feature, Hint: hint, Err: err}
	}
	if int64(st.Type) != magic {
		return &FeatureError{Feature: feature, Hint: fmt.Sprintf("%s is not on one; %s", path, hint)}
	}
	return nil
}

// Probe checks, touching nothing, that the kernel and the system have
// what a Proxier with these options needs: a cgroup v2 directory at
// Options.Cgroup, a bpf filesystem under Options.PinPath (when set; its
// nearest existing ancestor), programs of type
// BPF_PROG_TYPE_CGROUP_SOCK_ADDR and the helpers they call. It returns an
// error wrapping a *FeatureError (errors.As; errors.Is ErrNotSupported)
// naming the first that is missing, or one wrapping ErrInvalidOptions.
func Probe(o Options) error {
	if err := probe(o); err != nil {
		return fmt.Errorf("ebpf: %w", err)
	}
	return nil
}

func probe(o Options) error {
	if o.Cgroup == "" {
		return fmt.Errorf("%w: Cgroup is empty: name a cgroup v2 directory", ErrInvalidOptions)
	}
	if err := probeFS(o.Cgroup, unix.CGROUP2_SUPER_MAGIC, "cgroup v2",
		"Options.Cgroup must be a directory of the unified hierarchy (CONFIG_CGROUPS; mount -t cgroup2 none <dir>)"); err != nil {
		return err
	}
	if o.PinPath != "" {
		dir := o.PinPath
		for {
			if _, err := os.Stat(dir); err == nil || dir == "/" || dir == "." {
				break
			}
			dir = filepath.Dir(dir)
		}
		if err := probeFS(dir, unix.BPF_FS_MAGIC, "bpffs",
			"Options.PinPath must lie on a bpf filesystem (CONFIG_BPF_SYSCALL; mount -t bpf bpf /sys/fs/bpf)"); err != nil {
			return err
		}
	}
	if err := features.HaveProgramType(ebpf.CGroupSockAddr); err != nil {
		return &FeatureError{Feature: "BPF_PROG_TYPE_CGROUP_SOCK_ADDR",
			Hint: "a kernel with CONFIG_BPF_SYSCALL and CONFIG_CGROUP_BPF, and CAP_BPF with CAP_NET_ADMIN (or root)", Err: err}
	}
	for _, h := range []struct {
		fn   asm.BuiltinFunc
		name string
	}{
		{asm.FnGetSocketCookie, "bpf_get_socket_cookie"},
		{asm.FnGetNetnsCookie, "bpf_get_netns_cookie (Linux 5.7)"},
		{asm.FnSetRetval, "bpf_set_retval (Linux 5.18)"},
	} {
		if err := features.HaveProgramHelper(ebpf.CGroupSockAddr, h.fn); err != nil {
			return &FeatureError{Feature: "helper " + h.name, Hint: "for BPF_PROG_TYPE_CGROUP_SOCK_ADDR programs (CONFIG_CGROUP_BPF)", Err: err}
		}
	}
	return nil
}
