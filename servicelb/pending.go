package servicelb

import (
	"slices"
	"time"
)

// pending is what the Runner has yet to sync, as one value: a sync takes
// it whole and, when it fails, restores it, so that whatever is added to
// it is carried by both at once and a failed sync loses nothing.
type pending struct {
	// dirty holds the services changed, each with the kinds of its
	// changes; kinds counts them by kind.
	dirty map[string]changeKind
	kinds [numKinds]int
	// node says the node changed.
	node bool
	// triggers hold when the changes of each dirty service were caused,
	// and the families they touched.
	triggers map[string][]trigger
	// queuedAt is when the oldest change was made; famQueued the same by
	// familyIndex.
	queuedAt  time.Time
	famQueued [2]time.Time
}

// trigger is when a change was caused, and the families it touched.
type trigger struct {
	at   time.Time
	fams familySet
}

func newPending() pending {
	return pending{dirty: map[string]changeKind{}, triggers: map[string][]trigger{}}
}

// empty reports whether nothing is pending.
func (p *pending) empty() bool { return len(p.dirty) == 0 && !p.node }

// mark adds kind k to the named service's changes.
func (p *pending) mark(name string, k changeKind) {
	old := p.dirty[name]
	p.dirty[name] = old | k
	for i := range numKinds {
		if bit := changeKind(1 << i); k&bit != 0 && old&bit == 0 {
			p.kinds[i]++
		}
	}
}

// addTrigger records a cause of the named service's changes, each time
// once with every family it touched.
func (p *pending) addTrigger(name string, t trigger) {
	ts := p.triggers[name]
	if i := slices.IndexFunc(ts, func(o trigger) bool { return o.at.Equal(t.at) }); i >= 0 {
		ts[i].fams |= t.fams
		return
	}
	p.triggers[name] = append(ts, t)
}

// queue records a change made at now that touched the families fams.
func (p *pending) queue(now time.Time, fams familySet) {
	if p.queuedAt.IsZero() {
		p.queuedAt = now
	}
	for _, f := range Families() {
		if i := familyIndex(f); fams.has(f) && p.famQueued[i].IsZero() {
			p.famQueued[i] = now
		}
	}
}

// take returns what is pending and leaves p empty.
func (p *pending) take() pending {
	q := *p
	*p = newPending()
	return q
}

// restore puts back q, taken by a sync that failed, with what came since:
// every change keeps its kinds and triggers, and the oldest queue times
// stand.
func (p *pending) restore(q pending) {
	for name, k := range q.dirty {
		p.mark(name, k)
	}
	p.node = p.node || q.node
	for name, ts := range q.triggers {
		for _, t := range ts {
			p.addTrigger(name, t)
		}
	}
	p.queuedAt = earliest(p.queuedAt, q.queuedAt)
	for i := range p.famQueued {
		p.famQueued[i] = earliest(p.famQueued[i], q.famQueued[i])
	}
}

// earliest returns the earlier of two times, either zero for none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
