//go:build linux

package ebpf

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Attached returns the ids of the programs attached directly to a cgroup
// v2 directory at the eight hooks a Proxier uses (connect, sendmsg,
// recvmsg and getpeername, IPv4 and IPv6), whoever attached them, hook
// by hook in the order a Proxier attaches them: what `bpftool cgroup show
// <dir>` lists for those hooks. Programs attached to the cgroup's
// ancestors, which also run for its sockets, are not listed. A clean-up
// check uses it to see that nothing is left.
func Attached(cgroup string) ([]ebpf.ProgramID, error) {
	f, err := os.Open(cgroup)
	if err != nil {
		return nil, fmt.Errorf("ebpf: attached programs: %w", err)
	}
	defer f.Close()
	var out []ebpf.ProgramID
	for _, h := range hooks {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: h.attach})
		if err != nil {
			return nil, fmt.Errorf("ebpf: attached programs of %s at %s: %w", cgroup, h.name, err)
		}
		for _, p := range res.Programs {
			out = append(out, p.ID)
		}
	}
	return out, nil
}

// attached reports whether a link still attaches a program to the
// Proxier's cgroup at h's attach point: a link pinned under h's name that
// attaches elsewhere is no hook of the Proxier's, and is never updated.
func (p *Proxier) attached(l link.Link, h hook) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	cg := info.Cgroup()
	return cg != nil && cg.CgroupId == p.cgID && ebpf.AttachType(cg.AttachType) == h.attach
}

// attach attaches every hook that is not attached to the cgroup, gives
// adopted links this process's programs (an atomic replacement: no
// socket goes unbalanced) and pins the links.
func (p *Proxier) attach() error {
	for i, h := range hooks {
		l := p.links[i]
		if l != nil && p.attached(l, h) {
			if p.fresh[i] {
				if err := l.Update(p.progs[i]); err != nil {
					return fmt.Errorf("replace program of %s: %w", h.name, err)
				}
				p.fresh[i] = false
				p.log.Info("adopted hook", "hook", h.name)
			}
			if err := p.pinLink(l, h); err != nil {
				return err
			}
			continue
		}
		nl, err := link.AttachCgroup(link.CgroupOptions{Path: p.opts.Cgroup, Attach: h.attach, Program: p.progs[i]})
		if err != nil {
			return fmt.Errorf("attach %s to %s: %w", h.name, p.opts.Cgroup, err)
		}
		if l != nil {
			if p.opts.PinPath != "" {
				_ = l.Unpin()
			}
			l.Close()
		}
		p.links[i], p.fresh[i] = nl, false
		if err := p.pinLink(nl, h); err != nil {
			return err
		}
		p.log.Info("attached hook", "hook", h.name)
	}
	return nil
}
