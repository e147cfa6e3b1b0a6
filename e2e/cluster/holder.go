package cluster

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// HolderCommand is the subcommand of the harness's binary that runs a
// node's holder: the process whose network, mount and UTS namespaces the
// node's processes enter (nsenter --target). The binary's main must call
// Hold for it.
const HolderCommand = "node-holder"

// The values kubelet wants of three host-wide sysctls, which it would
// otherwise write (protectKernelDefaults: false) or refuse to start
// without (true). Each node's mount namespace shows them in files of its
// own, bound over /proc/sys, so that the host's stay as they are.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory": "1",
	"kernel/panic":         "10",
	"kernel/panic_on_oops": "1",
}

// Hold prepares a node's mount and UTS namespaces, which its caller
// (unshare --mount --uts --propagation private, in the node's network
// namespace) made for it, then writes "ready" to standard output and
// waits for standard input to close. The mounts:
//
//   - a sysfs of the node's network namespace on /sys, so that
//     /sys/class/net shows the node's links, with the host's cgroup
//     hierarchies bound back under /sys/fs/cgroup;
//   - a bpf filesystem of its own on /sys/fs/bpf, for the proxies' pins;
//   - a tmpfs on /run: containerd's sockets and state, xtables.lock;
//   - the node's directories over /var/lib and /var/log, and an empty
//     /etc/resolv.conf;
//   - the node's files over the sysctls kubelet checks.
//
// Nothing of it is visible outside the node's mount namespace, and all
// of it goes when the namespace's last process ends.
func Hold(hostname, dir string) error {
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	stage := filepath.Join(dir, "stage", "cgroup")
	if err := os.MkdirAll(stage, 0o755); err != nil {
		return err
	}
	steps := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"/sys/fs/cgroup", stage, "", unix.MS_BIND | unix.MS_REC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{stage, "/sys/fs/cgroup", "", unix.MS_MOVE, ""},
		{"bpf", "/sys/fs/bpf", "bpf", 0, "mode=700"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=755"},
		{filepath.Join(dir, "var-lib"), "/var/lib", "", unix.MS_BIND, ""},
		{filepath.Join(dir, "var-log"), "/var/log", "", unix.MS_BIND, ""},
		// No name server: a pull of an image the node lacks fails at
		// once instead of waiting for an answer that cannot come.
		{filepath.Join(dir, "etc-resolv.conf"), "/etc/resolv.conf", "", unix.MS_BIND, ""},
	}
	for _, d := range []string{"var-lib", "var-log", "sysctl"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc-resolv.conf"), nil, 0o644); err != nil {
		return err
	}
	for key, value := range kubeletSysctls {
		f := filepath.Join(dir, "sysctl", filepath.Base(key))
		if err := os.WriteFile(f, []byte(value+"\n"), 0o644); err != nil {
			return err
		}
		steps = append(steps, struct {
			src, dst, fstype string
			flags            uintptr
			data             string
		}{f, "/proc/sys/" + key, "", unix.MS_BIND, ""})
	}
	for _, s := range steps {
		if err := unix.Mount(s.src, s.dst, s.fstype, s.flags, s.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", s.src, s.dst, err)
		}
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return nil
}
