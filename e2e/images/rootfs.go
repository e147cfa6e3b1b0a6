package images

import (
	"archive/tar"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Rootfs is an image's file system, assembled from files of this machine:
// a program is copied with the shared libraries it needs (found as the
// dynamic loader finds them) and its loader, each at its canonical path
// in a merged-/usr layout, as Debian 12 has it.
type Rootfs struct {
	entries map[string]entry
	err     error
	// libDirs are where libraries are looked for after an ELF file's own
	// run paths.
	libDirs []string
}

type entry struct {
	host string // a file of the machine to copy
	data []byte // or these bytes
	link string // or a symbolic link to this
	dir  bool   // or a directory
	mode int64
}

// libDirs are where the dynamic loader looks for libraries without a
// cache: Debian's multiarch directories, then the plain ones.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// NewRootfs returns a file system with the merged-/usr links, /tmp, and
// the few files of /etc that C programs read: passwd and group with root
// and nobody, and nsswitch.conf (hosts from files, then DNS).
func NewRootfs() *Rootfs {
	r := &Rootfs{entries: map[string]entry{}, libDirs: libDirs}
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		r.Symlink("/"+d, "usr/"+d)
	}
	r.entries["/tmp"] = entry{dir: true, mode: 0o1777}
	r.File("/etc/passwd", []byte(passwd), 0o644)
	r.File("/etc/group", []byte(group), 0o644)
	r.File("/etc/nsswitch.conf", []byte("passwd: files\ngroup: files\nhosts: files dns\n"), 0o644)
	return r
}

// The accounts of every image: root and nobody.
const (
	passwd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	group  = "root:x:0:\nnogroup:x:65534:\n"
)

// Dir adds an empty directory.
func (r *Rootfs) Dir(p string) { r.entries[canonical(p)] = entry{dir: true, mode: 0o755} }

// Err returns the first error of an operation.
func (r *Rootfs) Err() error { return r.err }

func (r *Rootfs) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// File adds a file holding data.
func (r *Rootfs) File(p string, data []byte, mode int64) {
	r.entries[canonical(p)] = entry{data: data, mode: mode}
}

// Symlink adds a symbolic link.
func (r *Rootfs) Symlink(p, target string) { r.entries[p] = entry{link: target, mode: 0o777} }

// Copy adds the machine's file host at p, with its mode; an ELF program or
// library brings the libraries it needs and its loader.
func (r *Rootfs) Copy(host, p string) {
	st, err := os.Stat(host)
	if err != nil {
		r.fail(err)
		return
	}
	r.entries[canonical(p)] = entry{host: host, mode: int64(st.Mode().Perm())}
	r.libraries(host)
}

// Program adds a program of the machine at its own path.
func (r *Rootfs) Program(host string) { r.Copy(host, host) }

// Tree adds every regular file and symbolic link under the machine's
// directory dir, at the same paths, each file with what it needs.
func (r *Rootfs) Tree(dir string) {
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.Type().IsRegular():
			r.Copy(p, p)
		case d.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			r.Symlink(canonical(p), target)
		}
		return nil
	})
	if err != nil {
		r.fail(err)
	}
}

// canonical returns p with the merged-/usr links resolved: /bin/sh is
// /usr/bin/sh.
func canonical(p string) string {
	p = path.Clean("/" + p)
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if p == d || strings.HasPrefix(p, d+"/") {
			return "/usr" + p
		}
	}
	return p
}

// libraries adds the libraries an ELF file needs, and its loader, unless
// it is not ELF or links nothing.
func (r *Rootfs) libraries(host string) {
	f, err := elf.Open(host)
	if err != nil {
		return // not ELF: a script or data
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				r.fail(fmt.Errorf("%s: loader: %w", host, err))
				return
			}
			r.library(strings.TrimRight(string(b), "\x00"))
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return // static
	}
	runpath, _ := f.DynString(elf.DT_RUNPATH)
	rpath, _ := f.DynString(elf.DT_RPATH)
	var dirs []string
	for _, rp := range append(runpath, rpath...) {
		for d := range strings.SplitSeq(rp, ":") {
			dirs = append(dirs, strings.ReplaceAll(d, "$ORIGIN", filepath.Dir(host)))
		}
	}
	dirs = append(dirs, r.libDirs...)
	for _, lib := range needed {
		found := ""
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, lib)); err == nil {
				found = filepath.Join(d, lib)
				break
			}
		}
		if found == "" {
			r.fail(fmt.Errorf("%s needs %s, which is in none of %v: install its Debian package", host, lib, dirs))
			return
		}
		r.library(found)
	}
}

// library adds a library (or loader) at its canonical path, with the
// content of the file it names, and what it needs in turn.
func (r *Rootfs) library(p string) {
	dst := canonical(filepath.Join(resolveDir(filepath.Dir(p)), filepath.Base(p)))
	if _, ok := r.entries[dst]; ok {
		return
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		r.fail(err)
		return
	}
	r.entries[dst] = entry{host: real, mode: 0o755}
	r.libraries(real)
}

// resolveDir returns a directory with the links in it resolved.
func resolveDir(d string) string {
	if r, err := filepath.EvalSymlinks(d); err == nil {
		return r
	}
	return d
}

// layerFile is a layer written to a temporary file.
type layerFile struct {
	path   string
	digest string
	size   int64
}

// layer writes the file system as an uncompressed tar, in order of path,
// each directory before what it holds, every time stamp zero.
func (r *Rootfs) layer() (*layerFile, error) {
	if r.err != nil {
		return nil, r.err
	}
	f, err := os.CreateTemp("", "kproxy-e2e-layer-*.tar")
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	tw := tar.NewWriter(cw)
	err = r.write(tw)
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return nil, err
	}
	return &layerFile{path: f.Name(), digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), size: cw.n}, nil
}

func (r *Rootfs) write(tw *tar.Writer) error {
	paths := make([]string, 0, len(r.entries))
	for p := range r.entries {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	dirs := map[string]bool{"/": true}
	var mkdir func(string) error
	mkdir = func(d string) error {
		if dirs[d] {
			return nil
		}
		if err := mkdir(path.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		mode := int64(0o755)
		if e, ok := r.entries[d]; ok && e.dir {
			mode = e.mode
		}
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: mode})
	}
	for _, p := range paths {
		e := r.entries[p]
		if err := mkdir(path.Dir(p)); err != nil {
			return err
		}
		name := p[1:]
		switch {
		case e.dir:
			if err := mkdir(p); err != nil {
				return err
			}
		case e.link != "":
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: e.link, Mode: 0o777}); err != nil {
				return err
			}
		case e.host != "":
			if err := copyFile(tw, name, e.host, e.mode); err != nil {
				return err
			}
		default:
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: e.mode, Size: int64(len(e.data))}); err != nil {
				return err
			}
			if _, err := tw.Write(e.data); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(tw *tar.Writer, name, host string, mode int64) error {
	f, err := os.Open(host)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return errors.New(host + ": not a regular file")
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: st.Size()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}
