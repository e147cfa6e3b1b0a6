//go:build linux

package ebpf

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// formatContent lists the maps' entries one a line, in the manner of
// `bpftool map dump` with the keys and values decoded, each set with its
// name (service port and role) and each frontend with the service port
// and kind notes gives:
//
//	map kp_config: node netns cookie 4097
//	map kp_frontends: 3 entries
//	  10.96.0.10:80/tcp node=forward(1) pod=forward(1)  # default/web:http/ipv4 cluster IP
//	map kp_sets: 1 entries
//	  1 count=3 affinity=0s  # default/web:http/ipv4 cluster
//	map kp_slots: 3 entries
//	  1/0 10.244.1.2:8080
//
// The LRU maps (affinity pins, reverse translations) are the hooks' own
// and are not listed.
func formatContent(c *content, notes map[feKey]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "map %s: node netns cookie %d\n", mapConfig, c.cfg.NodeCookie)
	fes := slices.SortedFunc(maps.Keys(c.fe), compareFE)
	fmt.Fprintf(&b, "map %s: %d entries\n", mapFrontends, len(fes))
	for _, k := range fes {
		v := c.fe[k]
		fmt.Fprintf(&b, "  %s node=%s pod=%s", k, actionText(v.NodeAct, v.NodeSet), actionText(v.PodAct, v.PodSet))
		if n := notes[k]; n != "" {
			fmt.Fprintf(&b, "  # %s", n)
		}
		b.WriteByte('\n')
	}
	ids := slices.Sorted(maps.Keys(c.sets))
	fmt.Fprintf(&b, "map %s: %d entries\n", mapSets, len(ids))
	for _, id := range ids {
		v := c.sets[id]
		fmt.Fprintf(&b, "  %d count=%d affinity=%s", id, v.Count, time.Duration(v.Timeout)*time.Second)
		if n, ok := c.names[id]; ok {
			fmt.Fprintf(&b, "  # %s", n)
		}
		b.WriteByte('\n')
	}
	slots := slices.SortedFunc(maps.Keys(c.slots), func(a, b slotKey) int {
		return cmp.Or(cmp.Compare(a.Set, b.Set), cmp.Compare(a.Slot, b.Slot))
	})
	fmt.Fprintf(&b, "map %s: %d entries\n", mapSlots, len(slots))
	for _, k := range slots {
		fmt.Fprintf(&b, "  %d/%d %s\n", k.Set, k.Slot, c.slots[k])
	}
	members := slices.SortedFunc(maps.Keys(c.members), func(a, b memberKey) int {
		return cmp.Or(cmp.Compare(a.Set, b.Set), a.AddrPort().Compare(b.AddrPort()))
	})
	fmt.Fprintf(&b, "map %s: %d entries\n", mapMembers, len(members))
	for _, k := range members {
		fmt.Fprintf(&b, "  %d %s\n", k.Set, k.endpoint)
	}
	names := slices.Sorted(maps.Keys(c.names))
	fmt.Fprintf(&b, "map %s: %d entries\n", mapNames, len(names))
	for _, id := range names {
		fmt.Fprintf(&b, "  %d %q\n", id, c.names[id].String())
	}
	return b.String()
}

func actionText(a action, set uint32) string {
	if a == actForward {
		return fmt.Sprintf("forward(%d)", set)
	}
	return a.String()
}

func compareFE(a, b feKey) int {
	return cmp.Or(bytes.Compare(a.Addr[:], b.Addr[:]), bytes.Compare(a.Port[:], b.Port[:]), cmp.Compare(a.Proto, b.Proto))
}
