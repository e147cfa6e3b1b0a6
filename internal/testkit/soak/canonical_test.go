package soak

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// jumpTarget returns the chain a rule jumps to.
func jumpTarget(rule string) string {
	_, target, _ := strings.Cut(rule, " -j ")
	target, _, _ = strings.Cut(target, " ")
	return target
}

// lines returns the lines of s without their ends.
func lines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		out = append(out, strings.TrimRight(l, "\n"))
	}
	return out
}

// canonicalSave returns iptables-save text (stripped by
// xtables.StripSave) in a form two equal rulesets share whatever their
// history: per table, the chain declarations sorted, then the rules
// grouped by chain, chains in name order, rules in their order.
func canonicalSave(save string) string {
	var b strings.Builder
	var decls []string
	rules := map[string][]string{}
	for _, l := range lines(save) {
		switch {
		case strings.HasPrefix(l, "*"):
			b.WriteString(l + "\n")
			decls, rules = nil, map[string][]string{}
		case strings.HasPrefix(l, ":"):
			decls = append(decls, l)
		case strings.HasPrefix(l, "-A "):
			chain, _, _ := strings.Cut(strings.TrimPrefix(l, "-A "), " ")
			rules[chain] = append(rules[chain], l)
		case l == "COMMIT":
			slices.Sort(decls)
			for _, d := range decls {
				b.WriteString(d + "\n")
			}
			for _, chain := range slices.Sorted(maps.Keys(rules)) {
				for _, r := range rules[chain] {
					b.WriteString(r + "\n")
				}
			}
			b.WriteString("COMMIT\n")
		case l != "":
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// listedSet is a set or map of a listing with its elements.
type listedSet struct {
	kind, name string
	elems      []any
}

// listedElements returns the sets and maps of an `nft -j list table`
// listing that have elements.
func listedElements(listing string) ([]listedSet, error) {
	var doc struct {
		Nftables []map[string]struct {
			Name string `json:"name"`
			Elem []any  `json:"elem"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(listing), &doc); err != nil {
		return nil, fmt.Errorf("nft -j output: %w", err)
	}
	var out []listedSet
	for _, obj := range doc.Nftables {
		for kind, v := range obj {
			if (kind == "set" || kind == "map") && len(v.Elem) > 0 {
				out = append(out, listedSet{kind, v.Name, v.Elem})
			}
		}
	}
	return out, nil
}

// nftKey returns the key of a set or map element of an `nft -j` listing
// in nft's syntax: "10.0.0.1", "10.0.0.1 . tcp . 80", "10.0.0.0/8",
// "100-199".
func nftKey(el any) (string, error) {
	switch v := el.(type) {
	case string:
		return v, nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	case []any: // a map element: [key, value]
		if len(v) != 2 {
			return "", fmt.Errorf("map element %v", v)
		}
		return nftKey(v[0])
	case map[string]any:
		return nftKeyObject(v)
	}
	return "", fmt.Errorf("element %v", el)
}

func nftKeyObject(v map[string]any) (string, error) {
	if c, ok := v["concat"].([]any); ok {
		parts := make([]string, len(c))
		for i, p := range c {
			k, err := nftKey(p)
			if err != nil {
				return "", err
			}
			parts[i] = k
		}
		return strings.Join(parts, " . "), nil
	}
	if r, ok := v["range"].([]any); ok && len(r) == 2 {
		lo, err := nftKey(r[0])
		if err != nil {
			return "", err
		}
		hi, err := nftKey(r[1])
		if err != nil {
			return "", err
		}
		return lo + "-" + hi, nil
	}
	if p, ok := v["prefix"].(map[string]any); ok {
		addr, _ := p["addr"].(string)
		n, _ := p["len"].(float64)
		return fmt.Sprintf("%s/%d", addr, int(n)), nil
	}
	if e, ok := v["elem"].(map[string]any); ok {
		return nftKey(e["val"])
	}
	return "", fmt.Errorf("element %v", v)
}

// lineDiff returns the lines of want that got lacks and those got has
// beyond want, counting repeated lines.
func lineDiff(want, got string) (missing, extra []string) {
	count := map[string]int{}
	for _, l := range strings.Split(want, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(got, "\n") {
		count[l]--
	}
	for _, l := range strings.Split(want, "\n") {
		if count[l] > 0 {
			missing = append(missing, l)
			count[l]--
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if count[l] < 0 {
			extra = append(extra, l)
			count[l]++
		}
	}
	return missing, extra
}
