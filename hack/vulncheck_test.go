// Package hack holds the repository's scripts; its tests run them against
// stubs of the tools they drive.
package hack

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stubGo stands for go and for the govulncheck it builds: `go build -o
// PATH .../govulncheck` makes PATH a link to the stub; as govulncheck
// (`-db ...`) it records the module scanned (the directory it runs in)
// and then runs $STUB_CORE or $STUB_EXAMPLES, by that directory; anything
// else fails.
const stubGo = `#!/bin/sh
case "$*" in
"build -o "*govulncheck) mkdir -p "$(dirname "$3")" && ln -sf "$0" "$3"; exit 0 ;;
"-db "*) ;;
*) echo "stub go: unexpected: $*" >&2; exit 3 ;;
esac
case "$PWD" in
*/examples) echo examples >>"$STUB_LOG"; eval "$STUB_EXAMPLES" ;;
*) echo core >>"$STUB_LOG"; eval "$STUB_CORE" ;;
esac
`

// A clean scan's output, one with a called vulnerability in a module,
// one with a vulnerable package imported but not called, and one with a
// called vulnerability of the standard library.
const (
	clean    = `echo '{"config":{"protocol_version":"v1.0.0","scanner_name":"govulncheck"}}'`
	called   = clean + `; echo '{"finding":{"osv":"GO-2099-0001","trace":[{"module":"example.com/m","function":"F"}]}}'`
	imported = clean + `; echo '{"finding":{"osv":"GO-2099-0002","trace":[{"module":"example.com/n","package":"example.com/n/p"}]}}'`
	stdlib   = clean + `; echo '{"finding":{"osv":"GO-2099-0003","trace":[{"module":"stdlib","package":"net/http","function":"Serve"}]}}'`
)

// TestVulncheck runs hack/vulncheck.sh with a stub govulncheck: a scan that
// fails, or reports nothing, fails the check as a called vulnerability
// does, of a module or of the standard library; both modules are scanned
// whatever the first one's result; no temporary file is left.
func TestVulncheck(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3, which the script needs, is not installed (make deps)")
	}
	script, err := os.ReadFile("vulncheck.sh")
	require.NoError(t, err)
	for _, c := range []struct {
		name, core, examples string
		fail                 bool
		says                 string
	}{
		{name: "clean", core: clean, examples: clean, says: "core: called vulnerabilities in modules: 0"},
		{name: "govulncheck fails", core: "echo 'no such package' >&2; exit 1", examples: clean, fail: true,
			says: "core: govulncheck failed"},
		{name: "no output", core: "true", examples: clean, fail: true,
			says: "core: govulncheck reported nothing"},
		{name: "examples fail", core: clean, examples: "exit 2", fail: true, says: "examples: govulncheck failed"},
		{name: "called", core: called, examples: clean, fail: true, says: "module: GO-2099-0001 (example.com/m)"},
		{name: "not called", core: clean, examples: imported, says: "not called: GO-2099-0002 (example.com/n, imported)"},
		{name: "standard library", core: clean, examples: stdlib, fail: true, says: "standard library: GO-2099-0003"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A copy of the tree the script works in: itself under
			// hack/, the examples module and a database in place.
			root := t.TempDir()
			for _, d := range []string{"hack", "examples", "tools", ".cache/vulndb/stub/index", "bin", "tmp"} {
				require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
			}
			require.NoError(t, os.WriteFile(filepath.Join(root, "hack/vulncheck.sh"), script, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(root, ".cache/vulndb/stub/index/db.json"), []byte("{}"), 0o644))
			stub := filepath.Join(root, "bin/go")
			require.NoError(t, os.WriteFile(stub, []byte(stubGo), 0o755))
			log := filepath.Join(root, "scanned")

			cmd := exec.Command("sh", filepath.Join(root, "hack/vulncheck.sh"))
			cmd.Env = append(os.Environ(), "GO="+stub, "VULNDB=stub", "TMPDIR="+filepath.Join(root, "tmp"),
				"STUB_LOG="+log, "STUB_CORE="+c.core, "STUB_EXAMPLES="+c.examples)
			out, err := cmd.CombinedOutput()
			if c.fail {
				assert.Error(t, err, "the check passed:\n%s", out)
			} else {
				assert.NoError(t, err, string(out))
			}
			assert.Contains(t, string(out), c.says)
			scanned, err := os.ReadFile(log)
			require.NoError(t, err)
			assert.Equal(t, []string{"core", "examples"}, strings.Fields(string(scanned)), "modules scanned")
			left, err := os.ReadDir(filepath.Join(root, "tmp"))
			require.NoError(t, err)
			assert.Empty(t, left, "temporary files left")
		})
	}
}
