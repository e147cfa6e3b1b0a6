//go:build soak

package soak

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// iptDataplane knows the iptables backend's chains. Its faults work on
// the IPv4 nat table, which carries the soak's traffic.
type iptDataplane struct{}

// The chains the faults pick from.
const (
	iptServices = iptables.DefaultChainPrefix + "SERVICES"
	iptSVC      = iptables.DefaultChainPrefix + "SVC-"
	iptSEP      = iptables.DefaultChainPrefix + "SEP-"
)

func (iptDataplane) name() string { return "iptables" }

func (iptDataplane) features() []string {
	return []string{"nf_tables", "nft_compat", "nat", "veth", "conntrack"}
}

// kernelFaults leaves out a dormant table: the backend does not own the
// ip nat table and leaves its flags alone.
func (iptDataplane) kernelFaults() []faultKind {
	return []faultKind{faultFlush, faultDeleteChain, faultDeleteElement}
}

func (iptDataplane) canonical(ctx context.Context, h *netnstest.Host) (string, error) {
	var b strings.Builder
	for _, tool := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		out, err := h.Output(ctx, "", tool)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "# %s\n%s", tool, canonicalSave(xtables.StripSave(out)))
	}
	return b.String(), nil
}

func (d iptDataplane) inject(ctx context.Context, h *netnstest.Host, kind faultKind, _ servicelb.Service, random func(int) int) (injected, error) {
	switch kind {
	case faultFlush:
		return d.flush(ctx, h, random)
	case faultDeleteChain:
		return d.deleteChain(ctx, h, random)
	case faultDeleteElement:
		return d.deleteRule(ctx, h, random)
	}
	return injected{}, fmt.Errorf("no fault %s for iptables", kind)
}

// flush flushes every chain of the nat table (iptables-nft -t nat -F) or,
// half of the time, one chain: KPROXY-SERVICES or a KPROXY-SVC- chain.
func (iptDataplane) flush(ctx context.Context, h *netnstest.Host, random func(int) int) (injected, error) {
	if random(2) == 0 {
		if _, err := h.Output(ctx, "", "iptables-nft", "-t", "nat", "-F"); err != nil {
			return injected{}, err
		}
		return injected{
			detail: "iptables-nft -t nat -F",
			repaired: func(ctx context.Context) bool {
				return chainHas(ctx, h, "PREROUTING", "-j "+iptServices) && chainHas(ctx, h, iptServices, "-j "+iptSVC)
			},
		}, nil
	}
	chain := iptServices
	if random(2) == 0 {
		rule, err := randomRule(ctx, h, iptServices, "-j "+iptSVC, random)
		if err != nil {
			return injected{}, err
		}
		chain = jumpTarget(rule)
	}
	if _, err := h.Output(ctx, "", "iptables-nft", "-t", "nat", "-F", chain); err != nil {
		return injected{}, err
	}
	return injected{
		detail:   "iptables-nft -t nat -F " + chain,
		repaired: func(ctx context.Context) bool { return chainHas(ctx, h, chain, "-A "+chain+" ") },
	}, nil
}

// deleteChain deletes a service port's KPROXY-SVC- chain with the rule of
// KPROXY-SERVICES that jumps to it, in one iptables-nft-restore
// transaction.
func (iptDataplane) deleteChain(ctx context.Context, h *netnstest.Host, random func(int) int) (injected, error) {
	rule, err := randomRule(ctx, h, iptServices, "-j "+iptSVC, random)
	if err != nil {
		return injected{}, err
	}
	chain := jumpTarget(rule)
	restore := fmt.Sprintf("*nat\n-D %s\n-F %s\n-X %s\nCOMMIT\n", strings.TrimPrefix(rule, "-A "), chain, chain)
	if _, err := h.Output(ctx, restore, "iptables-nft-restore", "--noflush"); err != nil {
		return injected{}, err
	}
	return injected{
		detail: fmt.Sprintf("deleted chain %s and its rule in %s", chain, iptServices),
		repaired: func(ctx context.Context) bool {
			return chainHas(ctx, h, iptServices, rule) && chainHas(ctx, h, chain, "-A "+chain+" ")
		},
	}, nil
}

// deleteRule deletes the DNAT rule of an endpoint's KPROXY-SEP- chain:
// the flows the service sends there leave untranslated.
func (iptDataplane) deleteRule(ctx context.Context, h *netnstest.Host, random func(int) int) (injected, error) {
	rule, err := randomRule(ctx, h, iptServices, "-j "+iptSVC, random)
	if err != nil {
		return injected{}, err
	}
	svc := jumpTarget(rule)
	if rule, err = randomRule(ctx, h, svc, "-j "+iptSEP, random); err != nil {
		return injected{}, err
	}
	sep := jumpTarget(rule)
	if rule, err = randomRule(ctx, h, sep, "-j DNAT", random); err != nil {
		return injected{}, err
	}
	restore := fmt.Sprintf("*nat\n-D %s\nCOMMIT\n", strings.TrimPrefix(rule, "-A "))
	if _, err := h.Output(ctx, restore, "iptables-nft-restore", "--noflush"); err != nil {
		return injected{}, err
	}
	return injected{
		detail: fmt.Sprintf("deleted the DNAT rule of %s (of %s)", sep, svc),
		repaired: func(ctx context.Context) bool {
			// The endpoint may since have left the service, and its
			// chain with it.
			out, err := h.Output(ctx, "", "iptables-nft", "-t", "nat", "-S", sep)
			if err != nil {
				return chainGone(ctx, h, sep)
			}
			return slices.Contains(lines(out), rule)
		},
	}, nil
}

// chainHas reports whether a nat chain of h exists and a line of its
// `iptables-nft -S` listing contains s.
func chainHas(ctx context.Context, h *netnstest.Host, chain, s string) bool {
	out, err := h.Output(ctx, "", "iptables-nft", "-t", "nat", "-S", chain)
	return err == nil && slices.ContainsFunc(lines(out), func(l string) bool { return strings.Contains(l, s) })
}

// chainGone reports whether the nat chain is missing from h. (For a
// missing chain iptables-nft -S says it is "incompatible"; nft says what
// it means.)
func chainGone(ctx context.Context, h *netnstest.Host, chain string) bool {
	_, err := h.Output(ctx, "", "nft", "list", "chain", "ip", "nat", chain)
	return err != nil && strings.Contains(err.Error(), "No such file or directory")
}

// randomRule returns a random rule of a nat chain of h that contains s,
// as `iptables-nft -S` prints it.
func randomRule(ctx context.Context, h *netnstest.Host, chain, s string, random func(int) int) (string, error) {
	out, err := h.Output(ctx, "", "iptables-nft", "-t", "nat", "-S", chain)
	if err != nil {
		return "", err
	}
	var rules []string
	for _, l := range lines(out) {
		if strings.HasPrefix(l, "-A ") && strings.Contains(l, s) {
			rules = append(rules, l)
		}
	}
	if len(rules) == 0 {
		return "", errors.New("no rule of " + chain + " has " + s)
	}
	return rules[random(len(rules))], nil
}
