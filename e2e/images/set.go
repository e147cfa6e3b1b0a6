package images

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// The images the e2e framework asks for (test/utils/image/manifest.go of
// the Kubernetes release), by the names it gives them, so that no node
// ever pulls: a missing image would wait on a registry the cluster cannot
// reach.
const (
	Agnhost     = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
	AgnhostPrev = "registry.k8s.io/e2e-test-images/agnhost:2.55"
	BusyBox     = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
	Nginx       = "registry.k8s.io/e2e-test-images/nginx:1.15-4"
	GlibcDNS    = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0"
	Pause       = "registry.k8s.io/pause:3.10.2"
	// RegressionIssue74839 sends the out-of-window TCP packets of the
	// Conntrack test of kube-proxy's INVALID drop.
	RegressionIssue74839 = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.4"
	// KubeProxy is kube-proxy's image as kubeadm names it
	// (imageRepository/kube-proxy:kubernetesVersion).
	KubeProxy = "registry.k8s.io/kube-proxy:v1.36.3"
)

// Sources are the programs of the images that are built, not taken from
// Debian.
type Sources struct {
	// Agnhost is the agnhost binary of the Kubernetes release.
	Agnhost string
	// Porter is agnhost's porter directory in the release's source, whose
	// localhost.crt and localhost.key the image holds at its root (the
	// proxy tests' TLS ports serve them).
	Porter string
	// Pause is the sandbox program (package pause).
	Pause string
	// RegressionIssue74839 is that image's program, of the release.
	RegressionIssue74839 string
	// CoreDNS is held by agnhost's image at /coredns, as the release's
	// image holds it: the DNS tests run it as a name server of their own.
	CoreDNS string
	// KubeProxy is the kube-proxy binary of the release.
	KubeProxy string
}

// Debian's programs the test images hold, from the machine's packages
// (dash, bash, curl, wget, netcat-openbsd, bind9-dnsutils, libc-bin,
// iproute2), as the release's agnhost image holds Alpine's:
// the tests shell into agnhost pods and run them. Where busybox has an
// applet of the same name, Debian's is used: busybox's nc lacks -v, -t
// and -u, and its wget crashes.
var debianTools = []string{
	"/usr/bin/dash", "/usr/bin/bash", "/usr/bin/curl", "/usr/bin/wget", "/usr/bin/nc.openbsd",
	"/usr/bin/dig", "/usr/bin/host", "/usr/bin/nslookup", "/usr/bin/getent", "/usr/bin/ip",
}

// Test returns the test images: agnhost (two versions), stand-ins for
// nginx (agnhost serving HTTP on port 80) and glibc-dns-testing (the
// same tools, started with a shell), busybox, pause, and
// regression-issue-74839.
func Test(src Sources) ([]Image, error) {
	bb, err := busybox()
	if err != nil {
		return nil, err
	}
	agn := NewRootfs()
	agn.Copy(src.Agnhost, "/agnhost")
	agn.Symlink("/agnhost-2", "agnhost")
	agn.Copy(src.CoreDNS, "/coredns")
	agn.Dir("/uploads")
	// The user and group the release's image defines, which tests of
	// run-as settings name.
	agn.File("/etc/passwd", []byte(passwd+"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"), 0o644)
	agn.File("/etc/group", []byte(group+"user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"), 0o644)
	for _, t := range debianTools {
		agn.Program(t)
	}
	agn.Symlink("/usr/bin/sh", "dash")
	agn.Symlink("/usr/bin/nc", "nc.openbsd")
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		agn.Copy(filepath.Join(src.Porter, f), "/"+f)
	}
	bb.addTo(agn)
	if err := agn.Err(); err != nil {
		return nil, fmt.Errorf("agnhost: %w", err)
	}
	box := NewRootfs()
	bb.addTo(box)
	pause := NewRootfs()
	pause.Copy(src.Pause, "/pause")
	reg := NewRootfs()
	reg.Copy(src.RegressionIssue74839, "/regression-issue-74839")
	for _, r := range []*Rootfs{box, pause, reg} {
		if err := r.Err(); err != nil {
			return nil, err
		}
	}
	return []Image{
		{Name: Agnhost, Rootfs: agn, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}},
		{Name: AgnhostPrev, Rootfs: agn, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}},
		{Name: Nginx, Rootfs: agn, Entrypoint: []string{"/agnhost", "netexec", "--http-port=80"}},
		{Name: GlibcDNS, Rootfs: agn, Cmd: []string{"sh"}},
		{Name: BusyBox, Rootfs: box, Cmd: []string{"sh"}},
		{Name: Pause, Rootfs: pause, Entrypoint: []string{"/pause"}},
		{Name: RegressionIssue74839, Rootfs: reg, Entrypoint: []string{"/regression-issue-74839"}},
	}, nil
}

// KubeProxyImage returns kube-proxy's image: the binary at
// /usr/local/bin/kube-proxy, as the release's image holds it, with what
// it runs: Debian's nft (nftables mode) and iptables in the nf_tables
// encoding (iptables mode; iptables, iptables-save, iptables-restore and
// the ip6tables ones are links to xtables-nft-multi, as the release
// image's iptables-wrapper makes them on a host whose kubelet uses
// nf_tables).
func KubeProxyImage(src Sources) (Image, error) {
	r := NewRootfs()
	r.Copy(src.KubeProxy, "/usr/local/bin/kube-proxy")
	r.Program("/usr/sbin/nft")
	r.Program("/usr/sbin/xtables-nft-multi")
	r.Tree("/usr/lib/x86_64-linux-gnu/xtables")
	for _, n := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		r.Symlink("/usr/sbin/"+n, "xtables-nft-multi")
	}
	if err := r.Err(); err != nil {
		return Image{}, fmt.Errorf("kube-proxy: %w", err)
	}
	return Image{Name: KubeProxy, Rootfs: r, Entrypoint: []string{"/usr/local/bin/kube-proxy"}}, nil
}

// busyboxApplets is Debian's busybox-static with its applets.
type busyboxApplets struct {
	bin     string
	applets []string // paths such as usr/bin/wget
}

func busybox() (*busyboxApplets, error) {
	bin := "/usr/bin/busybox"
	out, err := exec.Command(bin, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w (install Debian's busybox-static)", err)
	}
	return &busyboxApplets{bin: bin, applets: strings.Fields(string(out))}, nil
}

// addTo adds busybox and a link for each of its applets that r has no
// program of.
func (b *busyboxApplets) addTo(r *Rootfs) {
	r.Copy(b.bin, "/usr/bin/busybox")
	for _, a := range b.applets {
		p := canonical(a)
		if _, ok := r.entries[p]; ok {
			continue
		}
		r.Symlink(p, "/usr/bin/busybox")
	}
}
