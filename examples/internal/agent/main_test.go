package agent

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
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
	for _, want := range []string{"x: does things", "-backend", "-dry-run", "-metrics-addr", "nftables, iptables or ipvs"} {
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
