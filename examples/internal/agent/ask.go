package agent

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// subcommand runs `<name> explain`, `<name> trace` or `<name> state`
// when args start with one; ok is false otherwise.
func (p Program) subcommand(ctx context.Context, args []string, stdout, errOut io.Writer) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "explain":
		return p.explainCmd(ctx, args[1:], stdout, errOut), true
	case "trace":
		return p.traceCmd(ctx, args[1:], stdout, errOut), true
	case "state":
		return p.stateCmd(ctx, args[1:], stdout, errOut), true
	}
	return 0, false
}

// traceCmd asks a running proxy to follow the next packet of a flow
// through its rules.
func (p Program) traceCmd(ctx context.Context, args []string, stdout, errOut io.Writer) int {
	fs := flag.NewFlagSet(p.Name+" trace", flag.ContinueOnError)
	fs.SetOutput(errOut)
	server := fs.String("server", DefaultMetricsAddr, "the running proxy's metrics address (its --metrics-bind-address) to ask")
	from := fs.String("from", "", "the flow's source address (required)")
	to := fs.String("to", "", "the flow's destination: address:port, with /tcp, /udp or /sctp (required)")
	protocol := fs.String("protocol", "", "tcp (the default), udp or sctp, unless --to says it")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for a packet of the flow (at most 5m)")
	asJSON := fs.Bool("json", false, "print the trace as JSON")
	fs.Usage = func() {
		fmt.Fprintf(errOut, "Usage: %s trace --from ADDR --to ADDR:PORT[/PROTO] [flags]\n\n"+
			"Follow the next packet of a flow through the proxy's rules in the kernel (nftables and iptables\n"+
			"backends): each rule it meets and what became of it. Send the packet while it waits.\n\nFlags:\n", p.Name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return usageCode(err)
	}
	if _, err := ParseFlow(*from, *to, *protocol, "", ""); err != nil {
		fmt.Fprintf(errOut, "%s trace: %v\n", p.Name, err)
		return 2
	}
	q := url.Values{"from": {*from}, "to": {*to}, "protocol": {*protocol}, "timeout": {timeout.String()}}
	if *asJSON {
		q.Set("format", "json")
	}
	body, err := askWithin(ctx, *server, "/trace?"+q.Encode(), *timeout+10*time.Second)
	if err != nil {
		fmt.Fprintf(errOut, "%s trace: %v\n", p.Name, err)
		return 1
	}
	_, _ = stdout.Write(body)
	return 0
}

// explainCmd asks a running proxy (or, offline, a dumped state) what it
// decides for a flow, and why.
func (p Program) explainCmd(ctx context.Context, args []string, stdout, errOut io.Writer) int {
	fs := flag.NewFlagSet(p.Name+" explain", flag.ContinueOnError)
	fs.SetOutput(errOut)
	server := fs.String("server", DefaultMetricsAddr, "the running proxy's metrics address (its --metrics-bind-address) to ask")
	from := fs.String("from", "", "the flow's source: an address, a port optional (required)")
	to := fs.String("to", "", "the flow's destination: address:port, with /tcp, /udp or /sctp (required)")
	protocol := fs.String("protocol", "", "tcp (the default), udp or sctp, unless --to says it")
	origin := fs.String("origin", "", "outside, pod or node (default: told from the node's config, as the proxy tells it)")
	in := fs.String("in-interface", "", "the interface the flow comes in on, for the interface detect-local modes")
	asJSON := fs.Bool("json", false, "print the explanation as JSON (its schema: servicelb.ExplanationSchema)")
	stateFile := fs.String("state", "", "explain offline, against a state `"+p.Name+" state --json` dumped: no proxy asked, no privilege")
	fs.Usage = func() {
		fmt.Fprintf(errOut, "Usage: %s explain --from ADDR[:PORT] --to ADDR:PORT[/PROTO] [flags]\n\n"+
			"What the proxy decides for a new flow, and why: the frontend it hits, the verdict and its reasons,\n"+
			"the endpoints it may go to and each one left out with its reason.\n\nFlags:\n", p.Name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return usageCode(err)
	}
	flow, err := ParseFlow(*from, *to, *protocol, *origin, *in)
	if err != nil {
		fmt.Fprintf(errOut, "%s explain: %v\n", p.Name, err)
		return 2
	}
	if *stateFile != "" {
		st, err := loadState(*stateFile)
		if err != nil {
			fmt.Fprintf(errOut, "%s explain: %v\n", p.Name, err)
			return 1
		}
		e := st.Explain(flow)
		return printExplanation(&e, *asJSON, stdout, errOut)
	}
	q := url.Values{"from": {*from}, "to": {*to}, "protocol": {*protocol}, "origin": {*origin}, "in": {*in}}
	if *asJSON {
		q.Set("format", "json")
	}
	body, err := ask(ctx, *server, "/explain?"+q.Encode())
	if err != nil {
		fmt.Fprintf(errOut, "%s explain: %v\n", p.Name, err)
		return 1
	}
	_, _ = stdout.Write(body)
	return 0
}

func printExplanation(e *servicelb.Explanation, asJSON bool, stdout, errOut io.Writer) int {
	if !asJSON {
		fmt.Fprint(stdout, e.Text())
		return 0
	}
	b, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		fmt.Fprintf(errOut, "explain: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s\n", b)
	return 0
}

// stateCmd asks a running proxy what it serves, leaves out and last did.
func (p Program) stateCmd(ctx context.Context, args []string, stdout, errOut io.Writer) int {
	fs := flag.NewFlagSet(p.Name+" state", flag.ContinueOnError)
	fs.SetOutput(errOut)
	server := fs.String("server", DefaultMetricsAddr, "the running proxy's metrics address (its --metrics-bind-address) to ask")
	asJSON := fs.Bool("json", false, "print the state as JSON, which `"+p.Name+" explain --state` reads")
	if err := fs.Parse(args); err != nil {
		return usageCode(err)
	}
	body, err := ask(ctx, *server, "/state")
	if err != nil {
		fmt.Fprintf(errOut, "%s state: %v\n", p.Name, err)
		return 1
	}
	if *asJSON {
		_, _ = stdout.Write(body)
		return 0
	}
	var d StateDump
	if err := json.Unmarshal(body, &d); err != nil {
		fmt.Fprintf(errOut, "%s state: %v\n", p.Name, err)
		return 1
	}
	text, err := d.Text()
	if err != nil {
		fmt.Fprintf(errOut, "%s state: %v\n", p.Name, err)
		return 1
	}
	fmt.Fprint(stdout, text)
	return 0
}

// Text sums the dump up for a person: the last sync, each service port
// with its frontends, verdicts and endpoints, the clashes and the objects
// left out.
func (d *StateDump) Text() (string, error) {
	st, err := servicelb.NewState(d.Node, d.Services...)
	if err != nil {
		return "", fmt.Errorf("the dumped state does not load: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "backend: %s\n", d.Backend)
	if s := d.LastSync; s != nil {
		outcome := "ok"
		if s.Error != "" {
			outcome = "failed: " + s.Error
		}
		fmt.Fprintf(&b, "last sync: %s, took %s, %d services changed, %s\n", s.At.Format(time.RFC3339), s.Duration, s.Services, outcome)
	}
	fmt.Fprintf(&b, "service ports: %d\n", len(st.Ports()))
	for _, sp := range st.Ports() {
		fmt.Fprintf(&b, "  %s\n", sp)
		for _, fe := range sp.Frontends() {
			fmt.Fprintf(&b, "    %s\n", fe)
		}
	}
	if len(d.Conflicts) > 0 {
		b.WriteString("conflicts:\n")
		for _, c := range d.Conflicts {
			fmt.Fprintf(&b, "  %s\n", servicelb.Conflict(c))
		}
	}
	if len(d.LeftOut) > 0 {
		b.WriteString("left out:\n")
		for _, l := range d.LeftOut {
			fmt.Fprintf(&b, "  %s (%s, %s): %s\n", l.Object, l.Source, l.At.Format(time.RFC3339), l.Reason)
		}
	}
	return b.String(), nil
}

// loadState reads a state dump and builds its state.
func loadState(path string) (*servicelb.State, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d StateDump
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	st, err := servicelb.NewState(d.Node, d.Services...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// ask GETs path from the proxy's metrics address.
func ask(ctx context.Context, server, path string) ([]byte, error) {
	return askWithin(ctx, server, path, 10*time.Second)
}

// askWithin is ask with a bound of its own on the wait.
func askWithin(ctx context.Context, server, path string, within time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+withPort(server, DefaultMetricsPort)+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask the proxy at %s: %w", server, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the proxy at %s answers %s: %s", server, resp.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// usageCode is the exit code of a flag parse error: 0 for -help.
func usageCode(err error) int {
	if err == flag.ErrHelp {
		return 0
	}
	return 2
}
