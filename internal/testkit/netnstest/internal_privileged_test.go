//go:build privileged

package netnstest

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/nsutil"
	"golang.org/x/sys/unix"
)

func nsInode(t *testing.T, h netns.NsHandle) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// threadNS returns the inode of the calling thread's network namespace.
func threadNS(t *testing.T) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestDoSwitchesOnlyItsOwnThread runs functions in a namespace and checks
// they see it, while the caller's thread stays where it was, also when the
// function fails, panics or calls runtime.Goexit.
func TestDoSwitchesOnlyItsOwnThread(t *testing.T) {
	Require(t)
	h := NewHost(t, "do")
	want := nsInode(t, h.NS)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	home := threadNS(t)
	if home == want {
		t.Fatal("the test already runs in the host's namespace")
	}
	var inside uint64
	if err := h.Do(func() error { inside = threadNS(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != want {
		t.Errorf("inside Do: namespace %d, want %d", inside, want)
	}
	boom := errors.New("boom")
	if err := h.Do(func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Do returned %v, want f's error", err)
	}
	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "kaboom") {
				t.Errorf("recovered %v, want the panic of f", p)
			}
		}()
		h.Do(func() error { panic("kaboom") })
	}()
	if err := h.Do(func() error { runtime.Goexit(); return nil }); !errors.Is(err, nsutil.ErrGoexit) {
		t.Errorf("Do with Goexit returned %v", err)
	}
	if got := threadNS(t); got != home {
		t.Fatalf("caller's thread moved to namespace %d, was %d", got, home)
	}
	// Every other thread of the process is back home too.
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
	for _, task := range tasks {
		var st unix.Stat_t
		if unix.Stat(task, &st) == nil && st.Ino == want {
			t.Errorf("thread %s left in the host's namespace", task)
		}
	}
}

// TestDoEntersNoNamespaceItIsIn: Do with a handle of the namespace the
// calling thread is in runs f on that thread, entering nothing, so it
// works without CAP_SYS_ADMIN; Own says which handles those are.
func TestDoEntersNoNamespaceItIsIn(t *testing.T) {
	h := NewHost(t, "do-own")
	other := NewHost(t, "do-other")
	if err := h.Do(func() error {
		for _, c := range []struct {
			ns   netns.NsHandle
			want bool
		}{{0, true}, {netns.None(), true}, {h.NS, true}, {other.NS, false}} {
			own, err := nsutil.Own(c.ns)
			if err != nil || own != c.want {
				t.Errorf("Own(%d) = %v, %v; want %v", c.ns, own, err, c.want)
			}
		}
		WithoutCapabilities(t, func() {
			tid := unix.Gettid()
			var in int
			if err := nsutil.Do(h.NS, func() error { in = unix.Gettid(); return nil }); err != nil {
				t.Errorf("Do in the thread's own namespace without CAP_SYS_ADMIN: %v", err)
			}
			if in != tid {
				t.Errorf("f ran on thread %d, not on the calling thread %d", in, tid)
			}
		}, unix.CAP_SYS_ADMIN)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestCleanupRemovesEverything builds a topology with traffic in a subtest
// and checks that afterwards no name, mount, file descriptor or thread
// refers to its namespaces: the kernel frees them.
func TestCleanupRemovesEverything(t *testing.T) {
	Require(t)
	var names []string
	inodes := map[uint64]bool{}
	t.Run("topology", func(t *testing.T) {
		tp := New(t, Options{Backends: 2})
		for _, h := range tp.Hosts() {
			names = append(names, h.NSName)
			inodes[nsInode(t, h.NS)] = true
		}
		for _, b := range tp.Backends {
			b.Serve(t, "tcp", 80)
			b.Serve(t, "udp", 80)
		}
		tp.Client.Count(t, "tcp", netipPort(tp.Backends[0].IPv4, 80), 10)
		tp.Client.Count(t, "udp", netipPort(tp.Backends[1].IPv6, 80), 10)
	})
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(RunDir, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still in %s: %v", n, RunDir, err)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, n := range names {
		if strings.Contains(string(mounts), n) {
			t.Errorf("%s still mounted", n)
		}
	}
	if list, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, n := range names {
			if strings.Contains(string(list), n) {
				t.Errorf("ip netns list still shows %s", n)
			}
		}
	}
	refs, _ := filepath.Glob("/proc/self/fd/*")
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
	for ino := range inodes {
		ref := fmt.Sprintf("net:[%d]", ino)
		for _, fd := range refs {
			if l, _ := os.Readlink(fd); l == ref {
				t.Errorf("file descriptor %s still refers to %s", fd, ref)
			}
		}
		for _, task := range tasks {
			if l, _ := os.Readlink(task); l == ref {
				t.Errorf("thread %s still in %s", task, ref)
			}
		}
	}
}

// TestReapsLeftoversOfDeadProcesses plants namespaces named as if by
// other processes: one that has exited (a crashed run), one still running
// (pid 1) and one of this process. Only the first is removed.
func TestReapsLeftoversOfDeadProcesses(t *testing.T) {
	Require(t)
	if err := prepareRunDir(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := cmd.Process.Pid
	if alive(dead) {
		t.Skipf("pid %d was reused at once", dead)
	}
	token := newToken()
	names := map[string]bool{
		fmt.Sprintf("%s%d-%s-node", Prefix, dead, token):     false,
		fmt.Sprintf("%s1-%s-node", Prefix, token):            true,
		fmt.Sprintf("%s%d-%s-x", Prefix, os.Getpid(), token): true,
		"kptx-" + token: true,
	}
	for n := range names {
		h, err := createNamed(n)
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
		t.Cleanup(func() { deleteNamed(n) })
	}
	NewHost(t, "reaper")
	for n, stays := range names {
		_, err := os.Stat(filepath.Join(RunDir, n))
		if stays && err != nil {
			t.Errorf("%s was removed: %v", n, err)
		}
		if !stays && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("leftover %s of exited pid %d was not removed: %v", n, dead, err)
		}
	}
}

// TestProbesAgreeWithKernelConfig checks each feature probe against the
// kernel's configuration: a feature built in must be found, one not
// configured must not be (modules may or may not be loaded).
func TestProbesAgreeWithKernelConfig(t *testing.T) {
	Require(t)
	config := kernelConfig(t)
	symbols := map[string][]string{
		"nf_tables":  {"NF_TABLES"},
		"nft_compat": {"NFT_COMPAT", "NETFILTER_XT_MATCH_COMMENT"},
		"nat":        {"NFT_NAT", "NFT_MASQ"},
		"ipset":      {"IP_SET", "IP_SET_HASH_IP"},
		"conntrack":  {"NF_CT_NETLINK"},
		"ip_vs":      {"IP_VS"},
		"dummy":      {"DUMMY"},
		"veth":       {"VETH"},
		"bridge":     {"BRIDGE"},
		"sctp":       {"IP_SCTP"},
	}
	for feature, syms := range symbols {
		builtIn, absent := true, false
		for _, s := range syms {
			v, ok := config["CONFIG_"+s]
			builtIn = builtIn && v == "y"
			absent = absent || !ok
		}
		reason := missing([]string{feature})
		t.Logf("%s: config %v built in %v absent %v; probe: %q", feature, syms, builtIn, absent, reason)
		if builtIn && reason != "" {
			t.Errorf("%s is built in but the probe says: %s", feature, reason)
		}
		if absent && reason == "" {
			t.Errorf("%s is not configured but the probe found it", feature)
		}
	}
	if _, ok := probes()["netns"]; !ok {
		t.Error("no netns probe")
	}
}

func kernelConfig(t *testing.T) map[string]string {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		t.Skipf("no kernel config to compare with: %v", err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(z)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out
}
