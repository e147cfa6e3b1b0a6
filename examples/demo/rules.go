package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// kernelLister is implemented by backends that can read back, in their
// tools' text, what the kernel holds.
type kernelLister interface {
	List(ctx context.Context) (string, error)
}

// showRules prints the rules the kernel holds when the backend can read
// them back, else the backend's rendering of the state it applied.
func showRules(ctx context.Context, out io.Writer, a *agent.Agent) error {
	dp := a.Dataplane()
	title, text := "", ""
	if l, ok := dp.(kernelLister); ok {
		t, err := l.List(ctx)
		if err != nil {
			return fmt.Errorf("read the rules back: %w", err)
		}
		title, text = "Rules as the kernel now holds them", t
	} else if r, ok := dp.(servicelb.Renderer); ok {
		t, err := r.Render(a.Runner().Applied())
		if err != nil {
			return fmt.Errorf("render the rules: %w", err)
		}
		title, text = "Rules installed", t
	} else {
		return nil
	}
	fmt.Fprintf(out, "\n%s (namespace of the node):\n", title)
	for line := range strings.SplitSeq(strings.TrimRight(text, "\n"), "\n") {
		fmt.Fprintf(out, "  %s\n", line)
	}
	return nil
}
