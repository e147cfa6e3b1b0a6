package servicelb

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// The errors every backend shares: each package re-exports them
// (nftables.ErrClosed is servicelb.ErrClosed), so that errors.Is tells
// the same kind of failure of any backend with one value.
var (
	// ErrClosed: a Sync or Cleanup after the proxier was closed.
	ErrClosed = errors.New("proxier closed")
	// ErrNotSupported: the system cannot run the backend: not Linux (the
	// packages build everywhere, so that an agent's other parts do, and
	// every call returns it), or a kernel without a feature it needs.
	ErrNotSupported = errors.New("not supported on this system")
	// ErrInvalidOptions: an Options field of a backend is not valid.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrRenderOnly: a Sync or Cleanup of a proxier made for rendering
	// only (ForRendering), which holds no kernel state.
	ErrRenderOnly = errors.New("a proxier for rendering only holds no kernel state")
	// ErrKernel: a kernel operation failed; the backend's error says
	// which.
	ErrKernel = errors.New("kernel operation failed")
	// ErrLinkConflict: a link the backend would use exists and is of a
	// kind it may not use.
	ErrLinkConflict = errors.New("link exists and is of another kind")
)

// ErrPermission: the kernel refused a proxier's request for lack of
// privilege. Programming a network namespace needs CAP_NET_ADMIN in it
// (and CAP_SYS_ADMIN to open sockets in another namespace than the
// caller's); the error that wraps it names the request refused.
var ErrPermission = errors.New("not permitted: programming a network namespace needs CAP_NET_ADMIN in it")

// FeatureError names a kernel or system feature a backend needs and the
// system lacks; errors.Is(err, ErrNotSupported) holds for it. Every
// backend's Probe returns one (wrapped) for the first feature missing.
type FeatureError struct {
	// Feature is what is missing, such as "nf_tables", "cgroup v2" or
	// "BPF_PROG_TYPE_CGROUP_SOCK_ADDR".
	Feature string
	// Hint says what provides it.
	Hint string
	// Err is the underlying error, if any.
	Err error
}

func (e *FeatureError) Error() string {
	msg := fmt.Sprintf("missing %s: %s", e.Feature, e.Hint)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns ErrNotSupported and the underlying error.
func (e *FeatureError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrNotSupported}
	}
	return []error{ErrNotSupported, e.Err}
}

// Proxier makes a kernel dataplane match a desired State. The nftables,
// iptables, ipvs, ebpf and userspace packages implement it.
//
// Sync is idempotent: a Proxier remembers the last State it applied and
// sends the kernel only what Diff reports, so syncing an unchanged State
// sends nothing beyond a cheap check that nobody removed what it owns, and
// a sync's cost follows the size of the change, not of the State. A failed
// Sync leaves the previous state in place where the kernel allows it (see
// each backend) and the next Sync retries the whole difference. What a
// Sync applied, it says in its SyncReport: whether it wrote the whole
// state, which services it left out and why, and the state the kernel now
// holds.
type Proxier interface {
	// Sync makes the kernel match st, but for the services it must leave
	// out (SyncReport.LeftOut), and reports what it applied. An error
	// with a nil SyncReport.Applied means the sync applied nothing that
	// can be relied on; one with Applied set, that the kernel holds
	// Applied and a step after it failed (the deletion of stale flows).
	Sync(ctx context.Context, st *State) (SyncReport, error)
	// Cleanup removes everything the proxier owns from the kernel.
	Cleanup(ctx context.Context) error
	// Capabilities says what the proxier can express. A Runner refuses
	// services that do not fit, and Sync refuses service ports that do
	// not, before sending anything.
	Capabilities() Capabilities
	// Close releases what the proxier holds in the process (sockets,
	// descriptors, goroutines) and leaves the kernel state for the next
	// process; a Sync or Cleanup after it returns ErrClosed. A second
	// Close does nothing.
	Close() error
}

// SyncReport is what one Sync applied.
type SyncReport struct {
	// Applied is the state the kernel holds after the sync: the State
	// given less the services left out (State.Without), or that State
	// itself when none is. Nil when the sync applied nothing that can be
	// relied on; its error says why.
	Applied *State
	// Full reports that the sync wrote, or tried to write, the whole
	// state instead of the changes since the last one: the first sync, a
	// repair of what someone else changed in the kernel, a change of the
	// node. Metrics tell the two apart, as kube-proxy's full and partial
	// sync durations do.
	Full bool
	// LeftOut names each service the sync left out, with the error that
	// names it (a *ValidationError: a capability the backend lacks, more
	// than it can hold, a frontend someone else holds in the kernel,
	// something of it the kernel refused). Every other service is
	// applied. A service left out stays out, the last version of it the
	// kernel held removed, until it changes or goes; nil when none is.
	LeftOut map[string]error
}

// Renderer is implemented by proxiers that can show the kernel state they
// would install for a State, in the text of the dataplane's own tools.
type Renderer interface {
	Render(st *State) (string, error)
}

// FlowChecker is implemented by proxiers that can give the kernel's word
// on an explained flow (State.Explain): they read back what the kernel
// (or, for a proxy, its own tables) holds for the flow's frontend now, and
// compare it with what the explanation decides. Every backend of this
// module implements it.
type FlowChecker interface {
	// CheckFlow reads back the objects that serve the flow e explains,
	// which must be of the state the proxier applied last (a State it
	// reported as SyncReport.Applied). It returns an error only when it
	// cannot read: what it read that differs is a Difference.
	CheckFlow(ctx context.Context, e *Explanation) (KernelCheck, error)
}

// KernelCheck is a backend's reading of the objects that serve one
// explained flow.
type KernelCheck struct {
	// Backend names the backend that read.
	Backend string `json:"backend"`
	// Read lists what it read that serves the flow, one object a line,
	// in the dataplane's own terms: "chain cluster4: 2 rules", "map
	// endpoints4: 10.96.0.10 . tcp . 80 . 0 : 10.244.1.2 . 8080", a
	// virtual server with its real servers, a map entry, a listener.
	Read []string `json:"read"`
	// Differences are where what it read differs from the explanation:
	// a rule, element, virtual server, map entry or listener missing,
	// foreign (someone else's, in the way) or changed. None when the
	// kernel agrees.
	Differences []string `json:"differences"`
}

// Agrees reports whether the kernel agrees with the explanation.
func (k KernelCheck) Agrees() bool { return len(k.Differences) == 0 }

// Tracer is implemented by proxiers whose rules live in nf_tables (the
// nftables and iptables backends): they follow the next packet of a flow
// through their rules in the kernel, with nf_tables' own trace events.
type Tracer interface {
	// Trace marks for tracing the first packet of each new flow that
	// matches f (its destination address, port and protocol, and its
	// source address when valid), waits for the next one, and returns its
	// path through the proxier's rules, or the error that ended the wait
	// (ctx's, when no packet came). It leaves the proxier's rules as they
	// are.
	Trace(ctx context.Context, f Flow) (Trace, error)
}

// Trace is the path of one packet through a proxier's rules, as the
// kernel traced it.
type Trace struct {
	// Backend names the backend whose rules were followed.
	Backend string `json:"backend"`
	// Steps are the rules the packet met, in order; those of other owners
	// are left out.
	Steps []TraceStep `json:"steps"`
}

// TraceStep is one rule, chain end or policy a traced packet met.
type TraceStep struct {
	// Table and Chain are where it was; Rule is the rule's text (its
	// handle, "#<handle>", when it cannot be told), empty for the end of
	// a chain (a return) or a base chain's policy.
	Table string `json:"table"`
	Chain string `json:"chain"`
	Rule  string `json:"rule,omitempty"`
	// Verdict is what became of the packet there: "goto cluster4",
	// "jump ...", "accept" (a NAT rule's, once it translated the
	// packet), "drop", "continue" (a rule that only marked it), "return",
	// "policy accept".
	Verdict string `json:"verdict"`
}

// Text returns the trace one step a line: "table chain: rule -> verdict".
func (t Trace) Text() string {
	var b strings.Builder
	steps := "steps"
	if len(t.Steps) == 1 {
		steps = "step"
	}
	fmt.Fprintf(&b, "trace       %s, %d %s\n", t.Backend, len(t.Steps), steps)
	for _, s := range t.Steps {
		rule := s.Rule
		if rule == "" {
			rule = "(end of chain)"
		}
		fmt.Fprintf(&b, "            %s %s: %s -> %s\n", s.Table, s.Chain, rule, s.Verdict)
	}
	return b.String()
}
