package agent

import (
	"errors"
	"fmt"
	"io"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/iptables"
)

func openIPTables(o BackendOptions) (Dataplane, error) {
	ct, err := conntrack.New(conntrack.Options{NetNS: o.NetNS, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	p, err := iptables.New(iptables.Options{NetNS: o.NetNS, Logger: o.Logger, Conntrack: ct})
	if err != nil {
		ct.Close()
		return nil, err
	}
	return &withConntrack{Dataplane: p, ct: ct}, nil
}

// withConntrack is a backend with the conntrack client it cleans flows
// through; Close closes both.
type withConntrack struct {
	Dataplane
	ct *conntrack.Client
}

func (w *withConntrack) Close() error {
	var errs []error
	if c, ok := w.Dataplane.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	errs = append(errs, w.ct.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}
