package images

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
)

// Image is one image of an archive: its full name, such as
// registry.k8s.io/pause:3.10.2, its file system and how it starts.
type Image struct {
	Name       string
	Rootfs     *Rootfs
	Entrypoint []string
	Cmd        []string
	Env        []string
}

// The media types of an OCI image layout.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// archive writes a tar of an OCI image layout: the blobs once each (images
// built on one Rootfs share its layer), and an index naming each image
// the way containerd's import reads it (io.containerd.image.name).
type archive struct {
	tw    *tar.Writer
	blobs map[string]bool
	index []descriptor
}

// WriteArchive writes the images as one OCI archive at path, for
// `ctr images import`. The layers are uncompressed: the archive is read
// once per node, on the same machine.
func WriteArchive(path string, images ...Image) error {
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(path + ".tmp")
	a := &archive{tw: tar.NewWriter(f), blobs: map[string]bool{}}
	for _, img := range images {
		if err := a.add(img); err != nil {
			f.Close()
			return fmt.Errorf("image %s: %w", img.Name, err)
		}
	}
	if err := a.close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func (a *archive) add(img Image) error {
	layer, err := img.Rootfs.layer()
	if err != nil {
		return err
	}
	defer os.Remove(layer.path)
	if err := a.blobFile(layer.path, layer.digest, layer.size); err != nil {
		return err
	}
	config := map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{
			"Entrypoint": img.Entrypoint, "Cmd": img.Cmd,
			"Env": append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, img.Env...),
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layer.digest}},
	}
	cfg, err := a.blobJSON(config, mediaConfig)
	if err != nil {
		return err
	}
	manifest := map[string]any{
		"schemaVersion": 2, "mediaType": mediaManifest, "config": cfg,
		"layers": []descriptor{{MediaType: mediaLayer, Digest: layer.digest, Size: layer.size}},
	}
	m, err := a.blobJSON(manifest, mediaManifest)
	if err != nil {
		return err
	}
	m.Annotations = map[string]string{
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": img.Name,
	}
	a.index = append(a.index, m)
	return nil
}

func (a *archive) blobJSON(v any, mediaType string) (descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return descriptor{}, err
	}
	sum := sha256.Sum256(b)
	d := descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}
	if a.blobs[d.Digest] {
		return d, nil
	}
	a.blobs[d.Digest] = true
	return d, a.file("blobs/sha256/"+d.Digest[7:], b)
}

func (a *archive) blobFile(path, digest string, size int64) error {
	if a.blobs[digest] {
		return nil
	}
	a.blobs[digest] = true
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := a.tw.WriteHeader(&tar.Header{Name: "blobs/sha256/" + digest[7:], Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err = io.Copy(a.tw, f)
	return err
}

func (a *archive) file(name string, b []byte) error {
	if err := a.tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := a.tw.Write(b)
	return err
}

func (a *archive) close() error {
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mediaIndex, "manifests": a.index})
	if err != nil {
		return err
	}
	if err := a.file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := a.file("index.json", index); err != nil {
		return err
	}
	return a.tw.Close()
}

// ArchiveLayout writes the image of an OCI image layout directory (such
// as make image writes) as an archive at path, naming it name.
func ArchiveLayout(dir, name, path string) error {
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return err
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(b, &index); err != nil {
		return fmt.Errorf("%s/index.json: %w", dir, err)
	}
	if len(index.Manifests) != 1 {
		return fmt.Errorf("%s: %d images, want 1", dir, len(index.Manifests))
	}
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(path + ".tmp")
	a := &archive{tw: tar.NewWriter(f), blobs: map[string]bool{}}
	blobs, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		f.Close()
		return err
	}
	for _, e := range blobs {
		st, err := e.Info()
		if err != nil {
			f.Close()
			return err
		}
		if err := a.blobFile(filepath.Join(dir, "blobs", "sha256", e.Name()), "sha256:"+e.Name(), st.Size()); err != nil {
			f.Close()
			return err
		}
	}
	m := index.Manifests[0]
	m.Annotations = map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
	a.index = []descriptor{m}
	if err := a.close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}
