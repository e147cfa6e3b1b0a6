package main

import (
	"fmt"
	"strings"
	"time"
)

// times records how long each step of a run took, for its summary.
type times struct{ steps []*step }

type step struct {
	name  string
	begin time.Time
	d     time.Duration
	note  string
}

func newTimes() *times { return &times{} }

func (t *times) start(name string) *step {
	s := &step{name: name, begin: time.Now()}
	t.steps = append(t.steps, s)
	return s
}

// done ends the step; did says whether it did the work or found it done
// (a cached build).
func (s *step) done(did bool) {
	s.d = time.Since(s.begin)
	if !did {
		s.note = " (cached)"
	}
}

func (s *step) took() time.Duration { return s.d }

func (t *times) String() string {
	var b strings.Builder
	b.WriteString("times:\n")
	for _, s := range t.steps {
		fmt.Fprintf(&b, "  %-45s %8s%s\n", s.name, s.d.Round(time.Second), s.note)
	}
	return b.String()
}
