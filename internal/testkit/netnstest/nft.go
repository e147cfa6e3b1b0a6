//go:build linux

package netnstest

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

// CanonicalTable lists an nf_tables table of the host with `nft -j` and
// returns it in a form that two tables with the same content share
// whatever their history: handles dropped, sets and chains by name, set
// elements sorted, rules in order per chain. It fails the test when nft
// fails or prints what it cannot parse.
func (h *Host) CanonicalTable(t testing.TB, family, table string) string {
	t.Helper()
	out := h.Exec(t, "nft", "-j", "list", "table", family, table)
	s, err := CanonicalListing(out)
	if err != nil {
		t.Fatalf("netnstest: %s: %v\n%s", h.Name, err, out)
	}
	return s
}

// CanonicalListing is CanonicalTable's work on the output of
// `nft -j list table`.
func CanonicalListing(listing string) (string, error) {
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(listing), &doc); err != nil {
		return "", fmt.Errorf("nft -j output: %w", err)
	}
	sets, chains, rules := map[string]any{}, map[string]any{}, map[string][]any{}
	for _, obj := range doc.Nftables {
		for kind, v := range obj {
			delete(v, "handle")
			name, _ := v["name"].(string)
			switch kind {
			case "set", "map":
				if els, ok := v["elem"].([]any); ok {
					if err := sortJSON(els); err != nil {
						return "", err
					}
				}
				sets[kind+" "+name] = v
			case "chain":
				chains[name] = v
			case "rule":
				c, _ := v["chain"].(string)
				rules[c] = append(rules[c], v["expr"])
			}
		}
	}
	b, err := json.MarshalIndent(map[string]any{"sets": sets, "chains": chains, "rules": rules}, "", " ")
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// sortJSON sorts values by their JSON encoding.
func sortJSON(vs []any) error {
	type keyed struct {
		key []byte
		v   any
	}
	ks := make([]keyed, len(vs))
	for i, v := range vs {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		ks[i] = keyed{b, v}
	}
	slices.SortStableFunc(ks, func(a, b keyed) int { return slices.Compare(a.key, b.key) })
	for i := range ks {
		vs[i] = ks[i].v
	}
	return nil
}
