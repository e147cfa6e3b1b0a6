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
