package nftables

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
