//go:build soak

package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// nftDataplane knows the nftables backend's table.
type nftDataplane struct{}

// table is the backend's table, of family inet.
const table = nftables.DefaultTable

func (nftDataplane) name() string { return "nftables" }

func (nftDataplane) features() []string { return []string{"nf_tables", "nat", "veth", "conntrack"} }

func (nftDataplane) kernelFaults() []faultKind {
	return []faultKind{faultFlush, faultDeleteChain, faultDeleteElement, faultDormant}
}

func (nftDataplane) canonical(_ context.Context, h *netnstest.Host) (string, error) {
	out, err := h.Output(context.Background(), "", "nft", "-j", "list", "table", "inet", table)
	if err != nil {
		return "", err
	}
	return netnstest.CanonicalListing(out)
}

func (d nftDataplane) inject(ctx context.Context, h *netnstest.Host, kind faultKind, svc servicelb.Service, random func(int) int) (injected, error) {
	switch kind {
	case faultFlush:
		return d.flush(ctx, h)
	case faultDeleteChain:
		return d.deleteChain(ctx, h, svc, svc.Ports[random(len(svc.Ports))])
	case faultDeleteElement:
		return d.deleteElement(ctx, h, random)
	case faultDormant:
		return d.dormant(ctx, h)
	}
	return injected{}, fmt.Errorf("no fault %s for nftables", kind)
}

// flush flushes the whole table: every rule of every chain goes.
func (nftDataplane) flush(ctx context.Context, h *netnstest.Host) (injected, error) {
	if _, err := h.Output(ctx, "", "nft", "flush", "table", "inet", table); err != nil {
		return injected{}, err
	}
	return injected{
		detail: "nft flush table inet " + table,
		repaired: func(ctx context.Context) bool {
			out, err := h.Output(ctx, "", "nft", "list", "chain", "inet", table, "services")
			return err == nil && strings.Contains(out, "vmap @services4")
		},
	}, nil
}

// deleteChain flushes the shared balancing chain of cluster endpoints
// (cluster4), which every service port without affinity goes through,
// and deletes the first bucket of the service port's cluster IP from the
// endpoints map, in one transaction.
func (nftDataplane) deleteChain(ctx context.Context, h *netnstest.Host, svc servicelb.Service, port servicelb.Port) (injected, error) {
	const chain = "cluster4"
	key := fmt.Sprintf("%s . tcp . %d . 0", svc.ClusterIPs[0], port.Port)
	script := fmt.Sprintf("delete element inet %[1]s endpoints4 { %[2]s }\nflush chain inet %[1]s %[3]s\n", table, key, chain)
	hasRules := func(ctx context.Context) bool {
		out, err := h.Output(ctx, "", "nft", "list", "chain", "inet", table, chain)
		return err == nil && strings.Contains(out, "dnat")
	}
	if _, err := h.Output(ctx, script, "nft", "-f", "-"); err != nil {
		return injected{}, err
	}
	return injected{
		detail: fmt.Sprintf("flushed chain %s and deleted element { %s } of endpoints4", chain, key),
		repaired: func(ctx context.Context) bool {
			return hasRules(ctx) && hasElement(ctx, h, "map", "endpoints4", key)
		},
	}, nil
}

// deleteElement deletes a random element of a random set or map of the
// table that has elements, found by listing the table.
func (nftDataplane) deleteElement(ctx context.Context, h *netnstest.Host, random func(int) int) (injected, error) {
	out, err := h.Output(ctx, "", "nft", "-j", "list", "table", "inet", table)
	if err != nil {
		return injected{}, err
	}
	sets, err := listedElements(out)
	if err != nil {
		return injected{}, err
	}
	if len(sets) == 0 {
		return injected{}, errors.New("no set has elements")
	}
	set := sets[random(len(sets))]
	key, err := nftKey(set.elems[random(len(set.elems))])
	if err != nil {
		return injected{}, fmt.Errorf("set %s: %w", set.name, err)
	}
	if _, err := h.Output(ctx, "", "nft", "delete", "element", "inet", table, set.name, "{ "+key+" }"); err != nil {
		return injected{}, err
	}
	return injected{
		detail:   fmt.Sprintf("deleted element { %s } of %s", key, set.name),
		repaired: func(ctx context.Context) bool { return hasElement(ctx, h, set.kind, set.name, key) },
	}, nil
}

// dormant makes the table dormant: its base chains leave their hooks.
func (nftDataplane) dormant(ctx context.Context, h *netnstest.Host) (injected, error) {
	if _, err := h.Output(ctx, "", "nft", "add", "table", "inet", table, "{ flags dormant; }"); err != nil {
		return injected{}, err
	}
	return injected{
		detail: "table inet " + table + " made dormant",
		repaired: func(ctx context.Context) bool {
			flagged, err := tableFlagged(ctx, h)
			return err == nil && !flagged
		},
	}, nil
}

// tableFlagged reports whether the table has flags (of which the
// proxier sets none), from `nft -j list tables`. (nft 1.0.6 prints the
// value of the flags wrongly in JSON, so only their presence counts.)
func tableFlagged(ctx context.Context, h *netnstest.Host) (bool, error) {
	out, err := h.Output(ctx, "", "nft", "-j", "list", "tables")
	if err != nil {
		return false, err
	}
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return false, err
	}
	for _, obj := range doc.Nftables {
		if t, ok := obj["table"]; ok && t["family"] == "inet" && t["name"] == table {
			_, flagged := t["flags"]
			return flagged, nil
		}
	}
	return false, errors.New("no table " + table)
}

// hasElement reports whether the set or map (kind) of the table has an
// element of key. It lists the set rather than asking nft for the
// element: nft 1.0.6 finds no interval of the backends maps.
func hasElement(ctx context.Context, h *netnstest.Host, kind, name, key string) bool {
	out, err := h.Output(ctx, "", "nft", "-j", "list", kind, "inet", table, name)
	if err != nil {
		return false
	}
	sets, err := listedElements(out)
	if err != nil {
		return false
	}
	for _, s := range sets {
		for _, el := range s.elems {
			if k, err := nftKey(el); err == nil && k == key {
				return true
			}
		}
	}
	return false
}
