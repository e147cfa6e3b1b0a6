//go:build linux

package vmtest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Entry is one file of an initramfs.
type Entry struct {
	Path   string      // path inside the archive: relative, slash-separated
	Mode   fs.FileMode // type (dir, symlink or regular) and permission bits
	Link   string      // target of a symlink
	Source string      // host file holding a regular file's content
	Data   []byte      // content of a regular file that has no Source
}

// mergedTop are the top-level directories that the guest keeps as symlinks
// into /usr, the way Debian lays out its root ("merged /usr"). Host paths
// under them are stored under usr/ whatever the host's layout, so that the
// archive never holds a file beneath a symlink.
var mergedTop = []string{"bin", "sbin", "lib", "lib64"}

// Listing collects the files of an initramfs. Host paths are copied with
// every symlink on their way, so that a program finds its interpreter,
// libraries and alternatives links at the same paths as on the host.
type Listing struct {
	root    string
	entries map[string]Entry
}

// NewListing returns a Listing that reads host paths under root ("/" for
// the running system; tests pass a directory that stands for it). The
// listing starts with the merged-/usr symlinks (bin -> usr/bin, ...).
func NewListing(root string) *Listing {
	l := &Listing{root: root, entries: make(map[string]Entry)}
	for _, top := range mergedTop {
		l.AddSymlink(top, "usr/"+top)
	}
	return l
}

// AddDir adds a directory.
func (l *Listing) AddDir(p string, perm fs.FileMode) {
	p = archivePath(p)
	l.entries[p] = Entry{Path: p, Mode: fs.ModeDir | perm.Perm()}
}

// AddSymlink adds a symlink at p pointing at target.
func (l *Listing) AddSymlink(p, target string) {
	p = archivePath(p)
	l.entries[p] = Entry{Path: p, Mode: fs.ModeSymlink | 0o777, Link: target}
}

// AddData adds a regular file with the given content.
func (l *Listing) AddData(p string, data []byte, perm fs.FileMode) {
	p = archivePath(p)
	l.entries[p] = Entry{Path: p, Mode: perm.Perm(), Data: data}
}

// AddFile adds a regular file at p whose content is the host file source.
func (l *Listing) AddFile(p, source string, perm fs.FileMode) {
	p = archivePath(p)
	l.entries[p] = Entry{Path: p, Mode: perm.Perm(), Source: source}
}

// Has reports whether p was added (parent directories added implicitly by
// Entries do not count).
func (l *Listing) Has(p string) bool {
	_, ok := l.entries[archivePath(p)]
	return ok
}

// AddHost copies the host path p (absolute) into the listing at the same
// guest path: a regular file, or a directory with everything below it, and
// every symlink crossed on the way (each also followed). It returns the host
// names of the regular files added, so that callers can look for their
// shared libraries.
func (l *Listing) AddHost(p string) ([]string, error) {
	real, err := l.resolve(p, 0)
	if err != nil {
		return nil, fmt.Errorf("add %s: %w", p, err)
	}
	fi, err := os.Lstat(l.host(real))
	if err != nil {
		return nil, fmt.Errorf("add %s: %w", p, err)
	}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("add %s: not a regular file (%v)", p, fi.Mode())
		}
		l.AddFile(guestPath(real), l.host(real), fi.Mode())
		return []string{real}, nil
	}
	l.AddDir(guestPath(real), fi.Mode())
	children, err := os.ReadDir(l.host(real))
	if err != nil {
		return nil, fmt.Errorf("add %s: %w", p, err)
	}
	var files []string
	for _, c := range children {
		got, err := l.AddHost(path.Join(real, c.Name()))
		if err != nil {
			return nil, err
		}
		files = append(files, got...)
	}
	return files, nil
}

// resolve returns p with every symlink resolved (inside l.root), recording
// each symlink it crosses.
func (l *Listing) resolve(p string, depth int) (string, error) {
	p = path.Clean("/" + p)
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for i, part := range parts {
		if part == "" {
			continue
		}
		next := path.Join(cur, part)
		fi, err := os.Lstat(l.host(next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if depth >= 40 {
			return "", errors.New("too many levels of symbolic links")
		}
		target, err := os.Readlink(l.host(next))
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(cur, target)
		}
		l.recordLink(next, target)
		return l.resolve(path.Join(append([]string{target}, parts[i+1:]...)...), depth+1)
	}
	return cur, nil
}

// recordLink stores the host symlink at p (pointing at the absolute host
// path target) as a symlink with an absolute guest target.
func (l *Listing) recordLink(p, target string) {
	if slices.Contains(mergedTop, strings.TrimPrefix(p, "/")) {
		return // the guest's own merged-/usr links stand for these
	}
	l.AddSymlink(guestPath(p), "/"+guestPath(target))
}

func (l *Listing) host(p string) string { return filepath.Join(l.root, filepath.FromSlash(p)) }

// guestPath maps an absolute host path to its archive path, moving the
// merged top-level directories under usr/.
func guestPath(p string) string {
	p = archivePath(p)
	top, _, _ := strings.Cut(p, "/")
	if slices.Contains(mergedTop, top) {
		return "usr/" + p
	}
	return p
}

func archivePath(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// Entries returns every entry, with any missing parent directory added,
// sorted so that each directory comes before what it holds.
func (l *Listing) Entries() []Entry {
	all := make(map[string]Entry, len(l.entries))
	for p, e := range l.entries {
		all[p] = e
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := l.entries[d]; !ok {
				all[d] = Entry{Path: d, Mode: fs.ModeDir | 0o755}
			}
		}
	}
	out := make([]Entry, 0, len(all))
	for _, e := range all {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// Key returns a digest of the listing's content: paths, modes, links,
// inline data, and the size and modification time of each host file. Two
// listings with the same key produce the same archive, so an archive built
// once can be reused under its key.
func (l *Listing) Key() (string, error) {
	h := sha256.New()
	for _, e := range l.Entries() {
		fmt.Fprintf(h, "%s\x00%o\x00%s\x00", e.Path, uint32(e.Mode), e.Link)
		switch {
		case e.Source != "":
			fi, err := os.Stat(e.Source)
			if err != nil {
				return "", fmt.Errorf("key: %w", err)
			}
			fmt.Fprintf(h, "%s\x00%d\x00%d\n", e.Source, fi.Size(), fi.ModTime().UnixNano())
		default:
			sum := sha256.Sum256(e.Data)
			fmt.Fprintf(h, "%x\n", sum)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
