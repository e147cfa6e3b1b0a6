package images

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readArchive returns the files of an archive, by name.
func readArchive(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		out[h.Name] = b
	}
}

// layerFiles returns the entries of a layer: name to link target ("" for
// a file or directory).
func layerFiles(t *testing.T, layer []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(strings.NewReader(string(layer)))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		out[h.Name] = h.Linkname
	}
}

func TestRootfsBringsLibraries(t *testing.T) {
	curl := "/usr/bin/curl"
	if _, err := os.Stat(curl); err != nil {
		t.Skip("no curl on this machine (e2e/hack/deps.sh installs it)")
	}
	r := NewRootfs()
	r.Program(curl)
	r.Symlink("/usr/bin/sh", "dash")
	require.NoError(t, r.Err())
	dir := t.TempDir()
	archive := filepath.Join(dir, "a.tar")
	require.NoError(t, WriteArchive(archive, Image{Name: "example.org/curl:1", Rootfs: r, Entrypoint: []string{"/usr/bin/curl"}}))

	files := readArchive(t, archive)
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	require.NoError(t, json.Unmarshal(files["index.json"], &index))
	require.Len(t, index.Manifests, 1)
	assert.Equal(t, "example.org/curl:1", index.Manifests[0].Annotations["io.containerd.image.name"], "containerd's import names the image by it")
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	require.NoError(t, json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(index.Manifests[0].Digest, "sha256:")], &manifest))
	require.Len(t, manifest.Layers, 1)
	layer := layerFiles(t, files["blobs/sha256/"+strings.TrimPrefix(manifest.Layers[0].Digest, "sha256:")])
	for _, want := range []string{
		"usr/bin/curl",
		"usr/lib/x86_64-linux-gnu/libcurl.so.4", // curl's own library
		"usr/lib/x86_64-linux-gnu/libc.so.6",    // and what it needs in turn
		"usr/lib64/ld-linux-x86-64.so.2",        // the loader
		"etc/nsswitch.conf", "tmp/",
	} {
		assert.Contains(t, layer, want)
	}
	assert.Equal(t, "usr/bin", layer["bin"], "merged /usr: /bin is a link")
	assert.Equal(t, "dash", layer["usr/bin/sh"])
	assert.NotContains(t, layer, "bin/curl", "a program is kept at its canonical path")
}

func TestRootfsMissingLibrary(t *testing.T) {
	// An ELF file that needs a library nowhere on the machine: the
	// rootfs names it and its program.
	src := "/usr/bin/curl"
	if _, err := os.Stat(src); err != nil {
		t.Skip("no curl on this machine")
	}
	r := NewRootfs()
	r.libDirs = []string{t.TempDir()}
	r.Program(src)
	require.Error(t, r.Err())
	assert.Contains(t, r.Err().Error(), "/usr/bin/curl needs libcurl.so.4")
}

func TestRootfsTreeKeepsLinks(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "libxt_NAT.so"), []byte("not ELF"), 0o644))
	require.NoError(t, os.Symlink("libxt_NAT.so", filepath.Join(dir, "libxt_MASQUERADE.so")))
	r := NewRootfs()
	r.Tree(dir)
	require.NoError(t, r.Err())
	archive := filepath.Join(t.TempDir(), "a.tar")
	require.NoError(t, WriteArchive(archive, Image{Name: "example.org/x:1", Rootfs: r}))
	files := readArchive(t, archive)
	var layer map[string]string
	for name, b := range files {
		if strings.HasPrefix(name, "blobs/") && len(b) > 1024 && string(b[257:262]) == "ustar" {
			layer = layerFiles(t, b)
		}
	}
	require.NotNil(t, layer)
	assert.Equal(t, "libxt_NAT.so", layer[strings.TrimPrefix(filepath.Join(dir, "libxt_MASQUERADE.so"), "/")],
		"a link of the tree (an iptables extension by another name) stays a link")
	assert.Contains(t, layer, strings.TrimPrefix(filepath.Join(dir, "libxt_NAT.so"), "/"))
}

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"/bin/sh": "/usr/bin/sh", "bin/sh": "/usr/bin/sh", "/lib64/ld.so": "/usr/lib64/ld.so",
		"/usr/bin/x": "/usr/bin/x", "/agnhost": "/agnhost", "/library": "/library",
	} {
		assert.Equal(t, want, canonical(in), in)
	}
}
