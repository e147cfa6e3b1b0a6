package ipset

import (
	"context"
	"fmt"
	"slices"
)

// SyncResult counts what Sync sent to the kernel.
type SyncResult struct {
	Added   int // entries added, or re-added because their comment changed
	Deleted int // entries deleted
}

// Sync makes a set hold exactly desired. It lists the set, validates every
// desired entry (nothing is sent if one does not fit), then adds the
// missing entries and re-adds those whose comment differs, and only then
// deletes the extra ones, so that an entry that stays is never absent. An
// entry present in both is not touched: its remaining timeout and its
// counters run on. Desired timeouts apply to the entries Sync adds.
//
// The kernel applies each batch entry by entry; if it fails part way (a
// full set), part of the change is applied and a later Sync completes it.
func (c *Client) Sync(ctx context.Context, name string, desired []Entry) (SyncResult, error) {
	info, current, err := c.Entries(ctx, name)
	if err != nil {
		return SyncResult{}, err
	}
	want, err := validateAll(&info.Set, desired)
	if err != nil {
		return SyncResult{}, err
	}
	add, del, err := diff(name, current, want)
	if err != nil {
		return SyncResult{}, err
	}
	var res SyncResult
	if err := c.batch(ctx, "add", cmdAdd, info, add); err != nil {
		return res, fmt.Errorf("sync: %w", err)
	}
	res.Added = len(add)
	if err := c.batch(ctx, "del", cmdDel, info, del); err != nil {
		return res, fmt.Errorf("sync: %w", err)
	}
	res.Deleted = len(del)
	if res.Added+res.Deleted > 0 {
		c.log.Info("ipset synced", "set", c.KernelName(name), "added", res.Added, "deleted", res.Deleted)
	}
	return res, nil
}

// diff returns the entries of want to add (missing from current, or with
// another comment) and the entries of current to delete (not in want), in
// a stable order. want must be in canonical form (validateEntry); two
// entries of want with the same members but different comments conflict.
func diff(set string, current, want []Entry) (add, del []Entry, err error) {
	have := make(map[key]Entry, len(current))
	for _, e := range current {
		have[e.key()] = e
	}
	wanted := make(map[key]Entry, len(want))
	for _, e := range want {
		k := e.key()
		if prev, dup := wanted[k]; dup {
			if prev.Comment != e.Comment || prev.Timeout != e.Timeout {
				return nil, nil, &EntryError{Set: set, Entry: e, Reason: "listed twice with different comment or timeout"}
			}
			continue
		}
		wanted[k] = e
		if cur, ok := have[k]; !ok || cur.Comment != e.Comment {
			add = append(add, e)
		}
	}
	for _, e := range current {
		if _, ok := wanted[e.key()]; !ok {
			del = append(del, Entry{IP: e.IP, Protocol: e.Protocol, Port: e.Port, IP2: e.IP2, Net: e.Net})
		}
	}
	slices.SortStableFunc(del, func(a, b Entry) int { return compareEntries(a, b) })
	return add, del, nil
}

func compareEntries(a, b Entry) int {
	if c := a.IP.Compare(b.IP); c != 0 {
		return c
	}
	if a.Protocol != b.Protocol {
		return int(a.Protocol) - int(b.Protocol)
	}
	if a.Port != b.Port {
		return int(a.Port) - int(b.Port)
	}
	if c := a.IP2.Compare(b.IP2); c != 0 {
		return c
	}
	if c := a.Net.Addr().Compare(b.Net.Addr()); c != 0 {
		return c
	}
	return a.Net.Bits() - b.Net.Bits()
}
