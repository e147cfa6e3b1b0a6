package agent

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func TestProgramHelpAndBadFlags(t *testing.T) {
	p := Program{Name: "x", Usage: "x: does things", Sources: func(*slog.Logger) ([]Source, error) { return nil, nil }}
	var errOut bytes.Buffer
	if code := p.Run(context.Background(), []string{"--help"}, io.Discard, &errOut); code != 0 {
		t.Errorf("--help exit %d", code)
	}
	for _, want := range []string{"x: does things", "-backend", "-dry-run", "-metrics-addr", "nftables, iptables, ipvs, ebpf", "or userspace"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	if code := p.Run(context.Background(), []string{"--bogus"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("bad flag exit %d, want 2", code)
	}
	errOut.Reset()
	if code := p.Run(context.Background(), []string{"--backend", "bogus"}, io.Discard, &errOut); code != 1 || !strings.Contains(errOut.String(), `--backend \"bogus\"`) {
		t.Errorf("bad backend: exit %d, %q", code, errOut.String())
	}
}

// oneService is a source of one service.
type oneService struct{ svc servicelb.Service }

func (s oneService) Name() string { return "one" }

func (s oneService) Run(ctx context.Context, dst *servicelb.Source, _ Reporter) error {
	if err := dst.Upsert(s.svc); err != nil {
		return err
	}
	dst.Synced()
	<-ctx.Done()
	return nil
}

// TestProgramNodeCIDRs: under --detect-local-mode=NodeCIDR without
// --node-cidrs, a program that knows its node's pod CIDRs supplies them,
// and the rules recognise pods by them; --node-cidrs wins; without a node
// name the program refuses to start.
func TestProgramNodeCIDRs(t *testing.T) {
	var asked []string
	p := Program{Name: "x", Usage: "x",
		Sources: func(*slog.Logger) ([]Source, error) { return []Source{oneService{web}}, nil },
		NodeCIDRs: func(_ context.Context, node string) ([]netip.Prefix, error) {
			asked = append(asked, node)
			return []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}, nil
		},
	}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var out, errOut bytes.Buffer
		code := p.Run(ctx, append([]string{"--backend", "iptables", "--dry-run", "--once"}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := run("--detect-local-mode", "NodeCIDR", "--node-name", "n1")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, []string{"n1"}, asked)
	assert.Contains(t, out, "! -s 10.1.0.0/24 -d 10.96.0.10/32")

	code, out, errOut = run("--detect-local-mode", "NodeCIDR", "--node-name", "n1", "--node-cidrs", "10.2.0.0/24")
	require.Equal(t, 0, code, errOut)
	assert.Len(t, asked, 1, "asked for the node's CIDRs with --node-cidrs given")
	assert.Contains(t, out, "! -s 10.2.0.0/24 -d 10.96.0.10/32")

	code, _, errOut = run("--detect-local-mode", "NodeCIDR")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "--node-name")

	code, out, errOut = run("--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "-d 10.96.0.10/32 ! -i cbr0")
	assert.Len(t, asked, 1)
}
