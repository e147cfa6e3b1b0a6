package nftables

import (
	"testing"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// SharedShards returns how many backends maps the proxier's last applied
// state reads from more than one load-balancing chain.
func SharedShards(p *Proxier) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	if p.model != nil {
		for _, c := range p.model.shards {
			if c > 1 {
				n++
			}
		}
	}
	return n
}

// GoldenCases are the states whose renderings testdata holds.
func GoldenCases() map[string]func(t *testing.T) *servicelb.State { return goldenCases() }
