//go:build linux

package archtest

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/ipvs"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/userspace"
)

// noFDEnv, in the environment of this test binary, makes
// TestRenderNeedsNoSocket render in a process that cannot open any file
// descriptor, and print the results after renderedMark.
const (
	noFDEnv      = "KPROXY_RENDER_WITHOUT_FDS"
	renderedMark = "rendered: "
)

// offlineRenderers render a state the way each backend does for a dry
// run: from its options, or from a Proxier made for rendering, built as
// part of the rendering.
func offlineRenderers() map[string]func(*servicelb.State) (string, error) {
	return map[string]func(*servicelb.State) (string, error){
		"nftables": func(st *servicelb.State) (string, error) { return nftables.Render(st, nftables.Options{}) },
		"nftables.ForRendering": func(st *servicelb.State) (string, error) {
			p, err := nftables.ForRendering(nftables.Options{})
			if err != nil {
				return "", err
			}
			return p.Render(st)
		},
		"iptables": func(st *servicelb.State) (string, error) { return iptables.Render(st, iptables.Options{}) },
		"ipvs":     func(st *servicelb.State) (string, error) { return ipvs.Render(st, ipvs.Options{}) },
		"ebpf": func(st *servicelb.State) (string, error) {
			nft, err := nftables.ForRendering(nftables.Options{})
			if err != nil {
				return "", err
			}
			p, err := ebpf.ForRendering(ebpf.Options{Cgroup: "/sys/fs/cgroup/kubepods", Packets: nft})
			if err != nil {
				return "", err
			}
			return p.Render(st)
		},
		"userspace": func(st *servicelb.State) (string, error) {
			p, err := userspace.New(userspace.Options{})
			if err != nil {
				return "", err
			}
			defer p.Close()
			return p.Render(st)
		},
	}
}

func renderState(t testing.TB) *servicelb.State {
	st, err := servicelb.NewState(servicelb.NodeConfig{NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}},
		servicelb.Service{Name: "ns/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, NodePort: 30080}},
			Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.244.1.2")}}})
	require.NoError(t, err)
	return st
}

// rendered is one backend's result.
type rendered struct{ Text, Err string }

// TestRenderNeedsNoSocket: every backend renders a state for a dry run
// (nftables, iptables and ipvs from their options, ebpf from a Proxier
// made by ForRendering with the nftables packet path's, userspace from a
// Proxier that holds no addresses) in a process whose open-file limit is
// down to the descriptors it has: one that cannot open a socket, nor any
// other file. The texts are those of this process, and nftables' and
// iptables' are those of a Proxier with its sockets.
func TestRenderNeedsNoSocket(t *testing.T) {
	if os.Getenv(noFDEnv) != "" {
		renderWithoutFDs(renderState(t))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRenderNeedsNoSocket$")
	cmd.Env = append(os.Environ(), noFDEnv+"=1")
	out, err := cmd.Output()
	require.NoError(t, err, "%s", out)
	i := strings.LastIndex(string(out), renderedMark)
	require.GreaterOrEqual(t, i, 0, "%s", out)
	var child map[string]rendered
	require.NoError(t, json.Unmarshal(out[i+len(renderedMark):], &child))

	st := renderState(t)
	for name, render := range offlineRenderers() {
		require.Contains(t, child, name)
		require.Empty(t, child[name].Err, name)
		want, err := render(st)
		require.NoError(t, err, name)
		assert.Contains(t, want, "10.96.0.10", name)
		assert.Equal(t, want, child[name].Text, name)
	}

	nft, err := nftables.New(nftables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	defer nft.Close()
	ipt, err := iptables.New(iptables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	defer ipt.Close()
	for name, r := range map[string]func(*servicelb.State) (string, error){"nftables": nft.Render, "iptables": ipt.Render} {
		text, err := r(st)
		require.NoError(t, err, name)
		assert.Equal(t, text, child[name].Text, name)
	}
}

// renderWithoutFDs lowers the open-file limit to the lowest free
// descriptor, checks that a socket cannot be opened, renders st with every
// backend, raises the limit again and prints the results; it exits.
func renderWithoutFDs(st *servicelb.State) {
	fail := func(err error) {
		fmt.Println("render without descriptors:", err)
		os.Exit(2)
	}
	free, err := unix.Dup(0)
	if err != nil {
		fail(err)
	}
	unix.Close(free)
	var saved unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &saved); err != nil {
		fail(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(free), Max: saved.Max}); err != nil {
		fail(err)
	}
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0); err != syscall.EMFILE {
		fail(fmt.Errorf("a socket opened under the limit: fd %d, %v", fd, err))
	}
	out := map[string]rendered{}
	for name, render := range offlineRenderers() {
		text, err := render(st)
		r := rendered{Text: text}
		if err != nil {
			r.Err = err.Error()
		}
		out[name] = r
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &saved); err != nil {
		fail(err)
	}
	b, err := json.Marshal(out)
	if err != nil {
		fail(err)
	}
	fmt.Printf("%s%s\n", renderedMark, b)
	os.Exit(0)
}
