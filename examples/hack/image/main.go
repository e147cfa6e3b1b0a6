// Command image packs a static kproxy binary into an OCI image layout,
// without a container runtime: one layer holding /usr/local/bin/kproxy,
// its entrypoint, and a bundle of CA certificates at
// /etc/ssl/certs/ca-certificates.crt, where Go's crypto/x509 looks for
// the system's, so that kproxy verifies servers with certificates of the
// public CAs (Consul over HTTPS without --consul-ca-file). The bundle is
// the build machine's, Debian's ca-certificates by default (--ca-bundle
// names another PEM file; empty leaves it out). `make image` runs it on
// the binary `make kproxy` builds (CGO_ENABLED=0):
//
//	go run ./examples/hack/image --binary bin/kproxy --out bin/kproxy-image --tag kproxy:v0.1.0
//
// Push the layout with any OCI tool, such as
// `crane push bin/kproxy-image REGISTRY/kproxy:v0.1.0` or
// `skopeo copy oci:bin/kproxy-image docker://REGISTRY/kproxy:v0.1.0`.
// The image is reproducible: its files and config carry the time zero, so
// the same binary and bundle make the same image.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"debug/elf"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinaryPath is where the image holds kproxy.
const BinaryPath = "/usr/local/bin/kproxy"

// KubeProxyPath is a symbolic link to kproxy where kube-proxy's image holds
// kube-proxy, so that an installer's kube-proxy DaemonSet (kubeadm's runs
// /usr/local/bin/kube-proxy --config=... --hostname-override=...) runs
// kproxy with its image replaced and nothing else.
const KubeProxyPath = "/usr/local/bin/kube-proxy"

// CABundlePath is where the image holds the CA certificates: the first
// file Go's crypto/x509 reads for the system's roots on Linux (as do
// OpenSSL and most tools on Debian).
const CABundlePath = "/etc/ssl/certs/ca-certificates.crt"

// DefaultCABundle is the bundle of Debian's ca-certificates package.
const DefaultCABundle = "/etc/ssl/certs/ca-certificates.crt"

// Options say what to pack and where.
type Options struct {
	// Binary is the static kproxy binary.
	Binary string
	// Out is the directory of the OCI image layout; it is replaced.
	Out string
	// Tag names the image in the layout's index
	// (org.opencontainers.image.ref.name), such as kproxy:v0.1.0.
	Tag string
	// Version and Revision go in the image's labels.
	Version, Revision string
	// Arch is the binary's architecture, as Go names it; default the
	// running one.
	Arch string
	// CABundle is a PEM file of CA certificates to hold at CABundlePath;
	// empty holds none.
	CABundle string
	// Platforms, when set, are the binaries of an image index, one image
	// per architecture (Binary and Arch are then unused).
	Platforms []Platform
}

// Platform is one architecture's binary of a multi-architecture image.
type Platform struct {
	// Arch is the architecture, as Go names it (amd64, arm64).
	Arch string
	// Binary is the static kproxy binary built for it.
	Binary string
}

// platforms is the --platform flag: linux/ARCH=BINARY, repeated.
type platforms []Platform

func (p *platforms) String() string { return fmt.Sprint(*p) }

func (p *platforms) Set(v string) error {
	spec, bin, ok := strings.Cut(v, "=")
	arch, found := strings.CutPrefix(spec, "linux/")
	if !ok || !found || arch == "" || bin == "" {
		return fmt.Errorf("%q: want linux/ARCH=BINARY", v)
	}
	*p = append(*p, Platform{Arch: arch, Binary: bin})
	return nil
}

func main() {
	var o Options
	flag.StringVar(&o.Binary, "binary", "bin/kproxy", "the static kproxy binary (CGO_ENABLED=0)")
	flag.StringVar(&o.Out, "out", "bin/kproxy-image", "directory of the OCI image layout to write (replaced)")
	flag.StringVar(&o.Tag, "tag", "kproxy:latest", "the image's name in the layout")
	flag.StringVar(&o.Version, "version", "", "version label")
	flag.StringVar(&o.Revision, "revision", "", "revision label")
	flag.StringVar(&o.Arch, "arch", runtime.GOARCH, "the binary's architecture")
	flag.StringVar(&o.CABundle, "ca-bundle", DefaultCABundle, "PEM file of the CA certificates the image holds at "+CABundlePath+" (default: Debian's ca-certificates); empty: none")
	flag.Var((*platforms)(&o.Platforms), "platform", "linux/ARCH=BINARY: an image index with one image per architecture (repeat it); instead of --binary and --arch")
	flag.Parse()
	build := Build
	if len(o.Platforms) > 0 {
		build = BuildIndex
	}
	digest, err := build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %s %s\n", o.Out, o.Tag, digest)
}

// Build writes the image and returns its manifest's digest.
func Build(o Options) (v1.Hash, error) {
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	img, err := platformImage(o, Platform{Arch: o.Arch, Binary: o.Binary})
	if err != nil {
		return v1.Hash{}, err
	}
	if err := os.RemoveAll(o.Out); err != nil {
		return v1.Hash{}, err
	}
	p, err := layout.Write(o.Out, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": o.Tag,
	})); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// BuildIndex writes an image index of one image per platform, named
// o.Tag, and returns the index's digest.
func BuildIndex(o Options) (v1.Hash, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range o.Platforms {
		img, err := platformImage(o, p)
		if err != nil {
			return v1.Hash{}, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: p.Arch},
		}})
	}
	if err := os.RemoveAll(o.Out); err != nil {
		return v1.Hash{}, err
	}
	l, err := layout.Write(o.Out, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := l.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": o.Tag,
	})); err != nil {
		return v1.Hash{}, err
	}
	return idx.Digest()
}

// platformImage is the image of one platform's binary.
func platformImage(o Options, p Platform) (v1.Image, error) {
	bin, err := os.ReadFile(p.Binary)
	if err != nil {
		return nil, err
	}
	if err := checkBinary(p.Binary, p.Arch); err != nil {
		return nil, err
	}
	files := []file{{path: BinaryPath, mode: 0o755, data: bin}, {path: KubeProxyPath, mode: 0o777, link: "kproxy"}}
	if o.CABundle != "" {
		pem, err := readCABundle(o.CABundle)
		if err != nil {
			return nil, err
		}
		files = append(files, file{path: CABundlePath, mode: 0o644, data: pem})
	}
	o.Arch = p.Arch
	return image(files, o)
}

// machines are the ELF machines of the architectures an image may hold.
var machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkBinary refuses a binary that needs a dynamic loader (the image has
// none) or is built for another architecture than arch.
func checkBinary(path, arch string) error {
	if err := checkStatic(path); err != nil {
		return err
	}
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	if want, ok := machines[arch]; ok && f.Machine != want {
		return fmt.Errorf("%s is built for %v, not %s", path, f.Machine, arch)
	}
	return nil
}

// checkStatic refuses a binary that needs a dynamic loader: the image has
// none.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is linked dynamically: build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

// readCABundle reads a PEM file of CA certificates, and refuses one that
// holds anything else, or none.
func readCABundle(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("CA bundle: %w (install Debian's ca-certificates, or name a bundle with --ca-bundle)", err)
	}
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			if strings.TrimSpace(string(rest)) != "" {
				return nil, fmt.Errorf("CA bundle %s: text that is not PEM after certificate %d", path, n)
			}
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("CA bundle %s: a %s block, want certificates only", path, blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("CA bundle %s: certificate %d: %w", path, n+1, err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("CA bundle %s: %w", path, errors.New("no certificate"))
	}
	return b, nil
}

func image(files []file, o Options) (v1.Image, error) {
	layer, err := filesLayer(files)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", o.Arch
	cf.Config.Entrypoint = []string{BinaryPath}
	cf.Config.Env = []string{"PATH=/usr/local/bin"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":  "kproxy",
		"org.opencontainers.image.source": "https://github.com/kproxy-dev/kproxy",
	}
	if o.Version != "" {
		cf.Config.Labels["org.opencontainers.image.version"] = o.Version
	}
	if o.Revision != "" {
		cf.Config.Labels["org.opencontainers.image.revision"] = o.Revision
	}
	return mutate.ConfigFile(img, cf)
}

// file is one regular file of the image, or a symbolic link to link.
type file struct {
	path string
	mode int64
	data []byte
	link string
}

// filesLayer is a gzipped tar of files, with their directories, every time
// zero.
func filesLayer(files []file) (v1.Layer, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	dirs := map[string]bool{}
	for _, f := range files {
		name := strings.TrimPrefix(f.path, "/")
		for i := range len(name) {
			if name[i] != '/' || dirs[name[:i+1]] {
				continue
			}
			dirs[name[:i+1]] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name[:i+1], Mode: 0o755, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: f.mode, Size: int64(len(f.data)), Format: tar.FormatPAX}
		if f.link != "" {
			h = &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: f.link, Mode: f.mode, Format: tar.FormatPAX}
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := b.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
