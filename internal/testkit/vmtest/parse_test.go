//go:build linux

package vmtest

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseLdd(t *testing.T) {
	out := `	linux-vdso.so.1 (0x00007ffd8b9f2000)
	libnftables.so.1 => /lib/x86_64-linux-gnu/libnftables.so.1 (0x00007f0e3c9a0000)
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0e3c7bf000)
	libgone.so.2 => not found
	/lib64/ld-linux-x86-64.so.2 (0x00007f0e3cb00000)
`
	libs, missing := ParseLdd(out)
	want := []string{"/lib/x86_64-linux-gnu/libnftables.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"}
	if diff := cmp.Diff(want, libs); diff != "" {
		t.Errorf("libs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"libgone.so.2"}, missing); diff != "" {
		t.Errorf("missing (-want +got):\n%s", diff)
	}
	if libs, _ := ParseLdd("\tstatically linked\n"); len(libs) != 0 {
		t.Errorf("static: %v", libs)
	}
}

func TestModuleClosure(t *testing.T) {
	dep := `kernel/net/netfilter/ipvs/ip_vs.ko: kernel/net/netfilter/nf_conntrack.ko kernel/lib/libcrc32c.ko
kernel/net/netfilter/ipvs/ip_vs_rr.ko: kernel/net/netfilter/ipvs/ip_vs.ko kernel/net/netfilter/nf_conntrack.ko kernel/lib/libcrc32c.ko
kernel/net/netfilter/nf_conntrack.ko: kernel/lib/libcrc32c.ko
kernel/lib/libcrc32c.ko:
kernel/drivers/net/dummy.ko:
kernel/drivers/net/veth.ko:
kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko
kernel/fs/jbd2/jbd2.ko:
kernel/net/sctp/sctp.ko: kernel/lib/libcrc32c.ko kernel/net/udp-tunnel.ko
kernel/net/udp-tunnel.ko:
`
	deps, err := ParseModuleDeps(strings.NewReader(dep))
	if err != nil {
		t.Fatal(err)
	}
	got, err := deps.Closure([]string{"kernel/net/netfilter/ipvs/", "dummy", "udp_tunnel"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kernel/drivers/net/dummy.ko",
		"kernel/lib/libcrc32c.ko",
		"kernel/net/netfilter/ipvs/ip_vs.ko",
		"kernel/net/netfilter/ipvs/ip_vs_rr.ko",
		"kernel/net/netfilter/nf_conntrack.ko",
		"kernel/net/udp-tunnel.ko",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("closure (-want +got):\n%s", diff)
	}
	if _, err := deps.Closure([]string{"no_such_module"}); err == nil {
		t.Error("unknown module: no error")
	}
}

func TestParseApt(t *testing.T) {
	depends := `linux-image-cloud-amd64
  Depends: linux-image-6.1.0-56-cloud-amd64
  Recommends: firmware-linux
`
	if got := ParseDepends(depends, "linux-image-"); got != "linux-image-6.1.0-56-cloud-amd64" {
		t.Errorf("ParseDepends = %q", got)
	}
	if got := ParseDepends("N: Unable to locate package x\n", "linux-image-"); got != "" {
		t.Errorf("ParseDepends of nothing = %q", got)
	}
	show := "Package: linux-image-6.1.0-56-cloud-amd64\nSource: linux-signed-amd64 (6.1.192+2)\nVersion: 6.1.192-2\n"
	if got := ParseVersion(show); got != "6.1.192-2" {
		t.Errorf("ParseVersion = %q", got)
	}
}

func TestTestArgs(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
	}{
		{nil, []string{"-test.v", "-test.timeout=14m0s"}},
		{[]string{"-run", "TestX", "-count=2"}, []string{"-test.v", "-test.run", "TestX", "-test.count=2", "-test.timeout=14m0s"}},
		{[]string{"-test.v", "-timeout", "1m", "-test.run=A B"}, []string{"-test.v", "-test.timeout", "1m", "-test.run=A B"}},
		{[]string{"-v=false", "-unknown"}, []string{"-test.v=false", "-unknown", "-test.timeout=14m0s"}},
	} {
		if diff := cmp.Diff(tc.want, TestArgs(tc.in, 15*time.Minute)); diff != "" {
			t.Errorf("TestArgs(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
	if got := TestArgs(nil, 40*time.Second); got[1] != "-test.timeout=20s" {
		t.Errorf("short watchdog: %q", got)
	}
}

func TestFiltered(t *testing.T) {
	for args, want := range map[string]bool{
		"": false, "-count 2": false, "-run X": true, "-test.run=X": true, "-skip Y": true, "-runner": false,
	} {
		if got := filtered(strings.Fields(args)); got != want {
			t.Errorf("filtered(%q) = %v, want %v", args, got, want)
		}
	}
}

// TestVMArgs: the console must be the first serial port (ttyS0, where the
// kernel and /init write) and the results file the second (ttyS1); an
// extra serial device declared before -serial would take ttyS0.
func TestVMArgs(t *testing.T) {
	vm := &VM{Kernel: "/k", Initrd: "/i", Results: "/r.log", MemoryMB: 2048, CPUs: 2}
	args := strings.Join(vm.Args(), " ")
	for _, want := range []string{
		"-accel tcg,thread=multi -cpu max -smp 2 -m 2048 -nographic -no-reboot",
		"-serial mon:stdio -serial file:/r.log",
		"-kernel /k -initrd /i -append console=ttyS0 ",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("qemu args lack %q: %s", want, args)
		}
	}
	if strings.Contains(args, "isa-serial") || strings.Contains(args, "kvm") {
		t.Errorf("qemu args: %s", args)
	}
}
