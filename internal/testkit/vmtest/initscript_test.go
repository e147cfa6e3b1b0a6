//go:build linux

package vmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestInitScript(t *testing.T) {
	c := InitConfig{
		Modules:  []string{"ip_vs", "dummy"},
		Binaries: []GuestBinary{{Name: "ipvs.test", Dir: "/vmtest/src/ipvs", Args: []string{"-test.skip=^(TestU)$"}}, {Name: "x.test", Dir: "/vmtest/src/a b"}},
		Args:     []string{"-test.v", "-test.run", "Test A|it's"},
		Env:      []string{"CI=true", "ODD=a b'c"},
	}
	script := string(c.Script())
	for _, want := range []string{
		"mount -t devtmpfs", "mount -t tmpfs -o mode=0755 tmpfs /run", "mkdir -p /run/netns",
		"for m in ip_vs dummy; do",
		"export CI=true\n", `export ODD='a b'\''c'` + "\n",
		"mark begin ipvs.test\ncd /vmtest/src/ipvs\n",
		`/vmtest/bin/ipvs.test -test.v -test.run 'Test A|it'\''s' '-test.skip=^(TestU)$' 2>&1`,
		`/vmtest/bin/x.test -test.v -test.run 'Test A|it'\''s' 2>&1`,
		"cd '/vmtest/src/a b'",
		"mark exit x.test",
		"mark done\n", "poweroff -f\n",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("script lacks %q:\n%s", want, script)
		}
	}
	if strings.Contains(script, "cttyhack") {
		t.Error("shell started without Shell")
	}
	c.Shell = true
	if !strings.Contains(string(c.Script()), "setsid cttyhack sh\n") {
		t.Error("Shell: no shell")
	}
	p := filepath.Join(t.TempDir(), "init")
	if err := os.WriteFile(p, c.Script(), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-n", p).CombinedOutput(); err != nil {
		t.Errorf("sh -n: %v\n%s", err, out)
	}
}

func TestShellQuote(t *testing.T) {
	for _, s := range []string{"plain", "", "a b", "it's", `"$HOME"`, "-test.run=^A$", "x\ny"} {
		out, err := exec.Command("sh", "-c", "printf %s "+ShellQuote(s)).Output()
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != s {
			t.Errorf("ShellQuote(%q) reads back as %q", s, out)
		}
	}
}
