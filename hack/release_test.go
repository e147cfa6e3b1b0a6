package hack

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newestRelease is the version of the CHANGELOG's newest release section.
func newestRelease(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../CHANGELOG.md")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^## (v\d+\.\d+\.\d+)\b`).FindSubmatch(b)
	require.NotNil(t, m, "CHANGELOG.md has no release section")
	return string(m[1])
}

// TestDeployNamesTheRelease: the DaemonSet runs the image of the newest
// release, and the systemd unit installs its binary.
func TestDeployNamesTheRelease(t *testing.T) {
	v := newestRelease(t)
	ds, err := os.ReadFile("../deploy/kubernetes/daemonset.yaml")
	require.NoError(t, err)
	assert.Contains(t, string(ds), "image: kproxy:"+v+"\n")
	unit, err := os.ReadFile("../deploy/systemd/kproxy.service")
	require.NoError(t, err)
	assert.Contains(t, string(unit), "kproxy-"+v+"-linux-amd64")
}

// TestReleaseIsReproducible: two releases of the commit checked out, each
// made by `make release` in a clone of its own, are byte-identical; the
// binaries are static, of their architecture and stamped with the
// version and commit; the image index names the version and holds an
// image per architecture, whose entrypoint runs; the SBOM names the
// release's modules at its version; the notes are the CHANGELOG's
// section; SHA256SUMS sums them all.
func TestReleaseIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two releases")
	}
	v := newestRelease(t)
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	commit := strings.TrimSpace(string(head))
	var outs [2]string
	for i := range outs {
		dir := t.TempDir()
		clone := filepath.Join(dir, "src")
		run(t, ".", "git", "clone", "-q", "--no-local", "..", clone)
		run(t, clone, "git", "checkout", "-q", commit)
		outs[i] = filepath.Join(dir, "out")
		run(t, clone, "make", "-s", "release", "VERSION="+v, "OUT="+outs[i])
	}
	names := listDir(t, outs[0])
	assert.Equal(t, names, listDir(t, outs[1]))
	for _, n := range names {
		a, err := os.ReadFile(filepath.Join(outs[0], n))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(outs[1], n))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(a, b), "%s differs between two releases of one commit", n)
	}
	out := outs[0]
	bins := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for arch, machine := range bins {
		name := "kproxy-" + v + "-linux-" + arch
		f, err := elf.Open(filepath.Join(out, name))
		require.NoError(t, err)
		assert.Equal(t, machine, f.Machine, name)
		for _, p := range f.Progs {
			assert.NotEqual(t, elf.PT_INTERP, p.Type, "%s is linked dynamically", name)
		}
		f.Close()
	}
	if runtime.GOARCH == "amd64" {
		got, err := exec.Command(filepath.Join(out, "kproxy-"+v+"-linux-amd64"), "--version").CombinedOutput()
		require.NoError(t, err, "%s", got)
		assert.True(t, strings.HasPrefix(string(got), "kproxy "+v+" (commit "+commit+", go"), "%s", got)
	}

	sums, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	require.NoError(t, err)
	var summed []string
	for line := range strings.Lines(string(sums)) {
		sum, name, ok := strings.Cut(strings.TrimSpace(line), "  ")
		require.True(t, ok, "SHA256SUMS line %q", line)
		b, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err)
		h := sha256.Sum256(b)
		assert.Equal(t, hex.EncodeToString(h[:]), sum, name)
		summed = append(summed, name)
	}
	others := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == "SHA256SUMS" })
	assert.ElementsMatch(t, others, summed, "SHA256SUMS sums every other file")

	notes, err := os.ReadFile(filepath.Join(out, "RELEASE-NOTES.md"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(notes), "## "+v+" "), "%.80s", notes)
	assert.NotContains(t, string(notes), "\n## ", "the notes run into the next section")

	var sbom struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			Name        string `json:"name"`
			VersionInfo string `json:"versionInfo"`
		} `json:"packages"`
		Files []struct {
			Name string `json:"fileName"`
		} `json:"files"`
	}
	b, err := os.ReadFile(filepath.Join(out, "kproxy-"+v+".spdx.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &sbom))
	assert.Equal(t, "SPDX-2.3", sbom.SPDXVersion)
	versions := map[string]string{}
	for _, p := range sbom.Packages {
		versions[p.Name] = p.VersionInfo
	}
	for _, m := range []string{"github.com/kproxy-dev/kproxy", "github.com/kproxy-dev/kproxy/kube", "github.com/kproxy-dev/kproxy/examples"} {
		assert.Equal(t, v, versions[m], "the SBOM's %s", m)
	}
	assert.Equal(t, runtime.Version(), versions["go"], "the SBOM's Go")
	assert.NotEmpty(t, versions["github.com/vishvananda/netns"], "the SBOM lacks a module kproxy links")
	assert.Len(t, sbom.Files, 2)

	checkImageIndex(t, filepath.Join(out, "kproxy-"+v+"-oci.tar"), v, commit)
}

// checkImageIndex reads the release's OCI layout: its index names the
// version and holds an image per architecture; the image of this machine's
// architecture, unpacked, runs its entrypoint.
func checkImageIndex(t *testing.T, tarball, v, commit string) {
	t.Helper()
	files := map[string][]byte{}
	f, err := os.Open(tarball)
	require.NoError(t, err)
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[strings.TrimPrefix(h.Name, "./")] = b
	}
	type descriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Annotations map[string]string `json:"annotations"`
		Platform    *struct {
			OS           string `json:"os"`
			Architecture string `json:"architecture"`
		} `json:"platform"`
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
		Layers    []descriptor `json:"layers"`
		Config    descriptor   `json:"config"`
	}
	blob := func(d string, into any) []byte {
		t.Helper()
		b, ok := files["blobs/"+strings.Replace(d, ":", "/", 1)]
		require.True(t, ok, "no blob %s", d)
		h := sha256.Sum256(b)
		require.Equal(t, d, "sha256:"+hex.EncodeToString(h[:]), "blob of another digest")
		if into != nil {
			require.NoError(t, json.Unmarshal(b, into))
		}
		return b
	}
	require.NoError(t, json.Unmarshal(files["index.json"], &index))
	require.Len(t, index.Manifests, 1)
	top := index.Manifests[0]
	assert.Equal(t, "kproxy:"+v, top.Annotations["org.opencontainers.image.ref.name"])
	assert.Equal(t, "application/vnd.oci.image.index.v1+json", top.MediaType)
	var images struct{ Manifests []descriptor }
	blob(top.Digest, &images)
	arches := map[string]string{}
	for _, m := range images.Manifests {
		require.NotNil(t, m.Platform)
		assert.Equal(t, "linux", m.Platform.OS)
		arches[m.Platform.Architecture] = m.Digest
	}
	require.Len(t, arches, 2)
	require.Contains(t, arches, "amd64")
	require.Contains(t, arches, "arm64")
	if runtime.GOARCH != "amd64" {
		return
	}
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	blob(arches["amd64"], &manifest)
	var config struct {
		Config struct {
			Entrypoint []string
			Labels     map[string]string
		} `json:"config"`
	}
	blob(manifest.Config.Digest, &config)
	assert.Equal(t, v, config.Config.Labels["org.opencontainers.image.version"])
	assert.Equal(t, commit, config.Config.Labels["org.opencontainers.image.revision"])
	require.Len(t, manifest.Layers, 1)
	zr, err := gzip.NewReader(bytes.NewReader(blob(manifest.Layers[0].Digest, nil)))
	require.NoError(t, err)
	lr := tar.NewReader(zr)
	entry := strings.TrimPrefix(config.Config.Entrypoint[0], "/")
	var bin []byte
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if h.Name == entry {
			bin, err = io.ReadAll(lr)
			require.NoError(t, err)
		}
	}
	require.NotNil(t, bin, "the layer holds no %s", entry)
	path := filepath.Join(t.TempDir(), "kproxy")
	require.NoError(t, os.WriteFile(path, bin, 0o755))
	got, err := exec.Command(path, "--version").CombinedOutput()
	require.NoError(t, err, "%s", got)
	assert.True(t, strings.HasPrefix(string(got), "kproxy "+v+" "), "%s", got)
}

func run(t *testing.T, dir string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
