//go:build linux

package vmtest

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCPIORoundTrip(t *testing.T) {
	src := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	first := []Entry{
		{Path: "usr", Mode: fs.ModeDir | 0o755},
		{Path: "usr/bin", Mode: fs.ModeDir | 0o755},
		{Path: "usr/bin/prog", Mode: 0o755, Source: src},
		{Path: "bin", Mode: fs.ModeSymlink | 0o777, Link: "usr/bin"},
	}
	second := []Entry{{Path: "init", Mode: 0o700, Data: []byte("odd-length")}}
	var buf bytes.Buffer
	if err := WriteCPIO(&buf, first); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%512 != 0 {
		t.Errorf("archive length %d is not padded to 512", buf.Len())
	}
	if err := WriteCPIO(&buf, second); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCPIO(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{Path: "usr", Mode: fs.ModeDir | 0o755},
		{Path: "usr/bin", Mode: fs.ModeDir | 0o755},
		{Path: "usr/bin/prog", Mode: 0o755, Data: []byte("#!/bin/sh\necho hi\n")},
		{Path: "bin", Mode: fs.ModeSymlink | 0o777, Link: "usr/bin"},
		{Path: "init", Mode: 0o700, Data: []byte("odd-length")},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("read back (-want +got):\n%s", diff)
	}
	checkWithCPIOTool(t, buf.Bytes()[:firstLen(t, first)], []string{"usr", "usr/bin", "usr/bin/prog", "bin"})
}

func firstLen(t *testing.T, entries []Entry) int {
	var b bytes.Buffer
	if err := WriteCPIO(&b, entries); err != nil {
		t.Fatal(err)
	}
	return b.Len()
}

// checkWithCPIOTool lists the archive with GNU cpio, an independent
// reader, when it is installed (make deps installs it).
func checkWithCPIOTool(t *testing.T, archive []byte, want []string) {
	t.Helper()
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Log("cpio not installed: archive not checked with it")
		return
	}
	cmd := exec.Command("cpio", "-it", "--quiet")
	cmd.Stdin = bytes.NewReader(archive)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -it: %v\n%s", err, out)
	}
	if diff := cmp.Diff(want, strings.Fields(string(out))); diff != "" {
		t.Errorf("cpio -it (-want +got):\n%s", diff)
	}
}

func TestCPIOUnsupported(t *testing.T) {
	err := WriteCPIO(&bytes.Buffer{}, []Entry{{Path: "dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice}})
	if err == nil || !strings.Contains(err.Error(), "dev/null") {
		t.Fatalf("device entry: err = %v, want an error naming it", err)
	}
}
