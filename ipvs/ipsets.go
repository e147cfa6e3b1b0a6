//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kproxy-dev/kproxy/ipset"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// setMaxElem bounds every helper set: room for a million entries (loop-back
// entries grow with endpoints, not services).
const setMaxElem = 1 << 20

// sets keeps the helper sets through the ipset package, and knows which
// entries the kernel holds.
type sets struct {
	c *ipset.Client
	// have are the entries in the kernel; nil until load.
	have map[setEntry]bool
	// index is each set's kernel index, for the rules' set matches.
	index map[string]uint16
	// writes counts the entries added and deleted.
	writes int
}

// setID names one helper set without the prefix, as the ipset client
// takes it: "<base>-4".
func setID(base string, f servicelb.Family) string { return setName("", base, f) }

func families() []servicelb.Family { return []servicelb.Family{servicelb.IPv4, servicelb.IPv6} }

// ensure creates the helper sets that are missing and learns their
// indexes.
func (s *sets) ensure(ctx context.Context) error {
	s.index = map[string]uint16{}
	for _, f := range families() {
		for _, spec := range setSpecs() {
			id := setID(spec.base, f)
			err := s.c.Ensure(ctx, ipset.Set{Name: id, Type: ipset.Type(spec.typ), Family: ipsetFam(f), MaxElem: setMaxElem})
			if err != nil {
				return fmt.Errorf("helper set: %w", err)
			}
			i, err := s.c.Index(ctx, id)
			if err != nil {
				return fmt.Errorf("helper set: %w", err)
			}
			s.index[id] = i
		}
	}
	return nil
}

// load reads every entry of the helper sets; missing sets are empty.
func (s *sets) load(ctx context.Context) error {
	s.have = map[setEntry]bool{}
	for _, f := range families() {
		for _, spec := range setSpecs() {
			_, entries, err := s.c.Entries(ctx, setID(spec.base, f))
			if errors.Is(err, ipset.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("helper set: %w", err)
			}
			for _, e := range entries {
				s.have[fromEntry(spec.base, f, e)] = true
			}
		}
	}
	return nil
}

// recorded reports whether an address virtual server is listed in the
// set that records the proxier's frontends.
func (s *sets) recorded(k vsKey) bool {
	return k.fwmark == 0 && s.have[setEntry{set: setFrontends, family: servicelb.FamilyOf(k.addr), addr: k.addr, proto: k.proto, port: k.port}]
}

// intact reports whether every helper set exists with the entries it
// should have, as far as their counts tell: one header dump.
func (s *sets) intact(ctx context.Context) (bool, error) {
	want := map[string]uint32{}
	for e := range s.have {
		want[setID(e.set, e.family)]++
	}
	infos, err := s.c.List(ctx)
	if err != nil {
		return false, fmt.Errorf("helper sets: %w", err)
	}
	found := 0
	for _, info := range infos {
		if _, ours := s.index[info.Name]; !ours {
			continue
		}
		found++
		if info.Index != s.index[info.Name] || info.Entries != want[info.Name] {
			return false, nil
		}
	}
	return found == len(s.index), nil
}

// add adds the entries the kernel does not hold.
func (s *sets) add(ctx context.Context, entries []setEntry) error {
	return s.each(entries, func(e setEntry) bool { return !s.have[e] }, func(id string, es []ipset.Entry) error {
		return s.c.Add(ctx, id, es...)
	}, true)
}

// del deletes the entries the kernel holds.
func (s *sets) del(ctx context.Context, entries []setEntry) error {
	return s.each(entries, func(e setEntry) bool { return s.have[e] }, func(id string, es []ipset.Entry) error {
		return s.c.Delete(ctx, id, es...)
	}, false)
}

// each sends the entries keep selects, one request per set, and records
// them as present or not.
func (s *sets) each(entries []setEntry, keep func(setEntry) bool, send func(string, []ipset.Entry) error, present bool) error {
	bySet := map[string][]setEntry{}
	for _, e := range entries {
		if keep(e) {
			id := setID(e.set, e.family)
			bySet[id] = append(bySet[id], e)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(bySet)) {
		es := bySet[id]
		slices.SortFunc(es, compareEntries)
		out := make([]ipset.Entry, len(es))
		for i, e := range es {
			out[i] = toEntry(e)
		}
		s.writes += len(out)
		if err := send(id, out); err != nil {
			return fmt.Errorf("helper set: %w", err)
		}
		for _, e := range es {
			if present {
				s.have[e] = true
			} else {
				delete(s.have, e)
			}
		}
	}
	return nil
}

// cleanup destroys every helper set. The kernel drops the references of
// deleted rules to the sets a moment after their transaction: a set still
// busy is tried again for a while.
func (s *sets) cleanup(ctx context.Context) error {
	s.have, s.index = nil, nil
	var err error
	for wait := 10 * time.Millisecond; ; wait *= 2 {
		err = s.c.Cleanup(ctx)
		if !errors.Is(err, ipset.ErrInUse) || wait > 2*time.Second {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	if err != nil && !errors.Is(err, ipset.ErrNotExist) {
		return fmt.Errorf("helper sets: %w", err)
	}
	return nil
}

func ipsetFam(f servicelb.Family) ipset.Family {
	if f == servicelb.IPv6 {
		return ipset.IPv6
	}
	return ipset.IPv4
}

func toEntry(e setEntry) ipset.Entry {
	return ipset.Entry{IP: e.addr, Protocol: ipset.Protocol(e.proto.Number()), Port: e.port, IP2: e.addr2, Net: e.net}
}

func fromEntry(base string, f servicelb.Family, e ipset.Entry) setEntry {
	out := setEntry{set: base, family: f, addr: e.IP, port: e.Port, addr2: e.IP2, net: e.Net}
	switch e.Protocol {
	case ipset.TCP:
		out.proto = servicelb.TCP
	case ipset.UDP:
		out.proto = servicelb.UDP
	case ipset.SCTP:
		out.proto = servicelb.SCTP
	}
	return out
}
