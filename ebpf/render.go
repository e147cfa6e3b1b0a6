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

	"github.com/kproxy-dev/kproxy/servicelb"
)

// formatContent lists the maps' entries one a line, in the manner of
// `bpftool map dump` with the keys and values decoded, each set with its
// name (service port and role) and each frontend with the service port
// and kind notes gives, then what the hooks wrote themselves (h): the
// affinity pins by client (its network namespace's cookie)
// and set, and the reverse translations by socket:
//
//	map kp_config: node netns cookie 4097
//	map kp_frontends: 3 entries
//	  10.96.0.10:80/tcp node=forward(1) pod=forward(1)  # default/web:http/ipv4 cluster IP
//	map kp_sets: 1 entries
//	  1 count=3 affinity=30s  # default/web:http/ipv4 cluster
//	map kp_slots: 3 entries
//	  1/0 10.244.1.2:8080
//	...
//	map kp_affinity: 1 entries (LRU of 16384, written by the hooks)
//	  netns 4097 (node) set 1 -> 10.244.1.2:8080 idle 2.5s  # default/web:http/ipv4 cluster
//	map kp_revnat: 1 entries (LRU of 65536, written by the hooks)
//	  socket 8193 10.244.1.2:8080 shows 10.96.0.10:80  # default/web:http/ipv4 cluster IP
func formatContent(c *content, h *hookContent, notes map[feKey]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "map %s: node netns cookie %d\n", mapConfig, c.cfg.NodeCookie)
	fes := slices.SortedFunc(maps.Keys(c.fe), compareFE)
	fmt.Fprintf(&b, "map %s: %d entries\n", mapFrontends, len(fes))
	for _, k := range fes {
		v := c.fe[k]
		fmt.Fprintf(&b, "  %s node=%s pod=%s", k, actionText(v.NodeAct, v.NodeSet), actionText(v.PodAct, v.PodSet))
		note(&b, notes[k])
	}
	ids := slices.Sorted(maps.Keys(c.sets))
	fmt.Fprintf(&b, "map %s: %d entries\n", mapSets, len(ids))
	for _, id := range ids {
		v := c.sets[id]
		fmt.Fprintf(&b, "  %d count=%d affinity=%s", id, v.Count, time.Duration(v.Timeout)*time.Second)
		note(&b, c.setName(id))
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
	formatHooks(&b, c, h, notes)
	return b.String()
}

// formatHooks lists what the hooks wrote in the LRU maps.
func formatHooks(b *strings.Builder, c *content, h *hookContent, notes map[feKey]string) {
	pins := slices.SortedFunc(maps.Keys(h.affinity), func(a, b affKey) int {
		return cmp.Or(cmp.Compare(a.Cookie, b.Cookie), cmp.Compare(a.Set, b.Set))
	})
	fmt.Fprintf(b, "map %s: %d entries (LRU of %d, written by the hooks)\n", mapAffinity, len(pins), h.sizes.Affinity)
	for _, k := range pins {
		v := h.affinity[k]
		node := ""
		if k.Cookie == c.cfg.NodeCookie {
			node = " (node)"
		}
		var idle time.Duration
		if h.now > v.Last {
			idle = time.Duration(h.now - v.Last).Round(time.Millisecond)
		}
		fmt.Fprintf(b, "  netns %d%s set %d -> %s idle %s", k.Cookie, node, k.Set, v.endpoint, idle)
		note(b, c.setName(k.Set))
	}
	socks := slices.SortedFunc(maps.Keys(h.reverse), func(a, b revKey) int {
		return cmp.Or(cmp.Compare(a.Cookie, b.Cookie), a.AddrPort().Compare(b.AddrPort()))
	})
	fmt.Fprintf(b, "map %s: %d entries (LRU of %d, written by the hooks)\n", mapReverse, len(socks), h.sizes.Reverse)
	for _, k := range socks {
		v := h.reverse[k]
		fmt.Fprintf(b, "  socket %d %s shows %s", k.Cookie, k.endpoint, v)
		note(b, serviceOf(v, notes))
	}
	flows := slices.SortedFunc(maps.Keys(h.flows), func(a, b affKey) int {
		return cmp.Or(cmp.Compare(a.Cookie, b.Cookie), cmp.Compare(a.Set, b.Set))
	})
	fmt.Fprintf(b, "map %s: %d entries (LRU of %d, written by the hooks)\n", mapFlows, len(flows), h.sizes.Reverse)
	for _, k := range flows {
		fmt.Fprintf(b, "  socket %d set %d -> %s", k.Cookie, k.Set, h.flows[k].endpoint)
		note(b, c.setName(k.Set))
	}
}

// note ends a line, with a comment when there is one.
func note(b *strings.Builder, n string) {
	if n != "" {
		fmt.Fprintf(b, "  # %s", n)
	}
	b.WriteByte('\n')
}

// setName returns a set's name, or "".
func (c *content) setName(id uint32) string {
	if n, ok := c.names[id]; ok {
		return n.String()
	}
	return ""
}

// serviceOf names the frontends of a service address and port a reverse
// translation shows: its TCP one, its UDP one, or both.
func serviceOf(e endpoint, notes map[feKey]string) string {
	var out []string
	for _, proto := range []uint8{6, 17} {
		if n := notes[feKey{Addr: e.Addr, Port: e.Port, Proto: proto}]; n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return strings.Join(out, " | ")
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

// Render returns the maps a Proxier with options o would hold for st,
// then Options.Packets' rendering; see Proxier.Render. It needs no
// privilege.
func Render(st *servicelb.State, o Options) (string, error) {
	p, err := ForRendering(o)
	if err != nil {
		return "", err
	}
	return p.Render(st)
}
