package hack

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"
)

// TestWorkspaceSumComplete: go.work.sum holds every checksum the
// workspace's module graph needs, so that listing it (go list -m all, as
// go doc, editors and scripts do) writes nothing and a checkout stays
// clean. It lists the graph in a copy of the workspace's go.work, go.mod
// and go.sum files.
func TestWorkspaceSumComplete(t *testing.T) {
	dir := t.TempDir()
	files := []string{"go.work", "go.work.sum", "go.mod", "go.sum", "kube/go.mod", "kube/go.sum", "examples/go.mod", "examples/go.sum"}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join("..", f))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	before, err := os.ReadFile(filepath.Join(dir, "go.work.sum"))
	require.NoError(t, err)
	cmd := exec.Command("go", "list", "-m", "all")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=", "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	after, err := os.ReadFile(filepath.Join(dir, "go.work.sum"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(before, after), "go list -m all rewrote go.work.sum: commit what it writes")
	for _, f := range files[2:] {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		orig, err := os.ReadFile(filepath.Join("..", f))
		require.NoError(t, err)
		assert.Equal(t, string(orig), string(b), "%s rewritten", f)
	}
}

// TestPublishedModulesNeedNoReplace: the modules a release tags (the core,
// kube and examples) carry no replace directive, so that `go install
// github.com/kproxy-dev/kproxy/examples/cmd/kproxy@<version>` works once
// the tags exist; they require each other at one version, the one the
// workspace's replace directives stand in for until it is tagged.
func TestPublishedModulesNeedNoReplace(t *testing.T) {
	work, err := os.ReadFile("../go.work")
	require.NoError(t, err)
	wf, err := modfile.ParseWork("go.work", work, nil)
	require.NoError(t, err)
	versions := map[string]string{}
	for _, r := range wf.Replace {
		versions[r.Old.Path] = r.Old.Version
	}
	for _, dir := range []string{".", "kube", "examples"} {
		b, err := os.ReadFile(filepath.Join("..", dir, "go.mod"))
		require.NoError(t, err)
		f, err := modfile.Parse(dir+"/go.mod", b, nil)
		require.NoError(t, err)
		assert.Empty(t, f.Replace, "%s/go.mod has replace directives", dir)
		for _, r := range f.Require {
			if want, ok := versions[r.Mod.Path]; ok {
				assert.Equal(t, want, r.Mod.Version, "%s/go.mod requires %s at another version than the workspace stands in for", dir, r.Mod.Path)
			} else {
				assert.NotContains(t, r.Mod.Path, "github.com/kproxy-dev/kproxy", "%s/go.mod requires %s, which the workspace does not stand in for", dir, r.Mod.Path)
			}
		}
	}
}
