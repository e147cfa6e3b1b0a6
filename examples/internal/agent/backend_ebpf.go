package agent

import (
	"context"
	"fmt"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/nftables"
)

// openEBPF opens the ebpf backend: socket hooks on --cgroup for the
// node's and its workloads' own connections, paired with the nftables
// backend for traffic from other hosts and the flows the hooks leave to
// it. ebpf.New checks the kernel first and names what is missing.
func openEBPF(o BackendOptions) (Dataplane, error) {
	if o.Cgroup == "" {
		return nil, fmt.Errorf("ebpf: %w: --cgroup: name the cgroup v2 directory whose sockets the hooks balance", ErrOptions)
	}
	ns := callers(o.NetNS)
	nft, err := nftables.New(nftables.Options{NetNS: ns, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	p, err := ebpf.New(ebpf.Options{Cgroup: o.Cgroup, PinPath: o.PinPath, NetNS: ns, Packets: nft, Logger: o.Logger})
	if err != nil {
		nft.Close()
		return nil, err
	}
	return p, nil
}

// probeEBPF checks what the ebpf backend needs, changing nothing: its
// packet path's (nftables), then the hooks' own (the cgroup, the bpf
// filesystem, the program type and helpers).
func probeEBPF(o BackendOptions) error {
	if err := nftables.Probe(nftables.Options{NetNS: callers(o.NetNS), Logger: o.Logger}); err != nil {
		return err
	}
	if o.Cgroup == "" {
		return nil // openEBPF names the flag
	}
	return ebpf.Probe(ebpf.Options{Cgroup: o.Cgroup, PinPath: o.PinPath})
}

// renderEBPF renders the maps and the nftables table without touching
// the kernel, or opening a socket.
func renderEBPF(o BackendOptions) (Renderer, error) {
	nft, err := nftables.ForRendering(nftables.Options{Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	cg := o.Cgroup
	if cg == "" {
		cg = "(--cgroup)"
	}
	return ebpf.ForRendering(ebpf.Options{Cgroup: cg, PinPath: o.PinPath, Packets: nft})
}

// callers returns the zero handle, which every backend's options take for
// the caller's own namespace, for netns.None().
func callers(ns netns.NsHandle) netns.NsHandle {
	if !ns.IsOpen() {
		return 0
	}
	return ns
}

// cleanupEBPF removes the hooks and maps pinned under --bpf-pin-path,
// without a cgroup: a cleanup knows none. Its packet path's table is the
// nftables backend's, which that backend's cleanup removes. Without a pin
// path nothing outlives the process that attached the hooks.
func cleanupEBPF(_ context.Context, o BackendOptions) error {
	if o.PinPath == "" {
		return fmt.Errorf("ebpf: cleanup: %w: no --bpf-pin-path, so its hooks leave with its process", ErrNothingOwned)
	}
	return ebpf.RemovePins(o.PinPath)
}
