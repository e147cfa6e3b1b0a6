//go:build privileged

package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goBuild builds kproxy into dir with cgo as asked and returns its path.
func goBuild(t *testing.T, dir, cgo string) string {
	t.Helper()
	out := filepath.Join(dir, "kproxy")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out,
		"-ldflags", "-s -w -X main.version=v9.8.7 -X main.commit=feedface", "../../cmd/kproxy")
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, string(b))
	return out
}

// The image of a static kproxy is an OCI layout naming it; unpacked, its
// entrypoint is the binary, which runs and prints the version it was
// built with.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	bin := goBuild(t, dir, "0")
	out := filepath.Join(dir, "layout")
	digest, err := Build(Options{Binary: bin, Out: out, Tag: "kproxy:v9.8.7", Version: "v9.8.7", Revision: "feedface"})
	require.NoError(t, err)

	idx, err := layout.ImageIndexFromPath(out)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im.Manifests, 1)
	desc := im.Manifests[0]
	assert.Equal(t, "kproxy:v9.8.7", desc.Annotations["org.opencontainers.image.ref.name"])
	assert.Equal(t, digest, desc.Digest)
	assert.EqualValues(t, "application/vnd.oci.image.manifest.v1+json", desc.MediaType)
	img, err := idx.Image(desc.Digest)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{BinaryPath}, cf.Config.Entrypoint)
	assert.Equal(t, "linux", cf.OS)
	assert.Equal(t, runtime.GOARCH, cf.Architecture)
	assert.Equal(t, "v9.8.7", cf.Config.Labels["org.opencontainers.image.version"])

	root := filepath.Join(dir, "root")
	unpack(t, mutate.Extract(img), root)
	got, err := exec.Command(filepath.Join(root, cf.Config.Entrypoint[0]), "--version").CombinedOutput()
	require.NoError(t, err, string(got))
	assert.True(t, strings.HasPrefix(string(got), "kproxy v9.8.7 (commit feedface, go"), string(got))

	// The same binary packs into the same image.
	again, err := Build(Options{Binary: bin, Out: filepath.Join(dir, "again"), Tag: "kproxy:v9.8.7", Version: "v9.8.7", Revision: "feedface"})
	require.NoError(t, err)
	assert.Equal(t, digest, again)
}

// A binary that needs a dynamic loader is refused: the image has none.
func TestImageRefusesDynamic(t *testing.T) {
	// Debian's own programs are linked dynamically.
	_, err := Build(Options{Binary: "/bin/true", Out: filepath.Join(t.TempDir(), "layout"), Tag: "kproxy:x"})
	assert.ErrorContains(t, err, "linked dynamically: build it with CGO_ENABLED=0")
}

// unpack writes a flattened image's files under root.
func unpack(t *testing.T, rc io.ReadCloser, root string) {
	t.Helper()
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(t, err)
		path := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(path, 0o755))
		case tar.TypeReg:
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode))
			require.NoError(t, err)
			_, err = io.Copy(f, tr)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		default:
			t.Fatalf("unexpected entry %s (type %c)", h.Name, h.Typeflag)
		}
	}
}
