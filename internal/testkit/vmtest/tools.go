//go:build linux

package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// DefaultTools are the host programs copied into the guest: busybox for the
// shell and basic commands, kmod's modprobe, util-linux's setpriv (to run
// a program with fewer capabilities), and the oracle tools that tests run
// to read kernel state back. The iptables names are symlinks to
// xtables-nft-multi; they are copied as such.
var DefaultTools = []string{
	"busybox", "modprobe", "setpriv",
	"ip", "nft", "ipset", "ipvsadm", "conntrack",
	"iptables", "iptables-save", "iptables-restore",
	"ip6tables", "ip6tables-save", "ip6tables-restore",
	"iptables-nft", "iptables-nft-save", "iptables-nft-restore",
	"ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore",
}

// DefaultDataPaths are host files and directories the tools read at run
// time: protocol and service names, iproute2's tables, and the iptables
// extensions, which are loaded with dlopen and so never appear in ldd's
// output.
var DefaultDataPaths = []string{
	"/etc/protocols", "/etc/services", "/etc/ethertypes", "/etc/iproute2",
	"/usr/lib/x86_64-linux-gnu/xtables",
}

// toolPath is where programs are looked up: the usual PATH plus the system
// directories, which a non-root PATH may leave out.
func toolPath() []string {
	dirs := filepath.SplitList(os.Getenv("PATH"))
	return append(dirs, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
}

// LookTool finds a program by name in toolPath.
func LookTool(name string) (string, error) {
	if path.IsAbs(name) {
		return name, nil
	}
	for _, d := range toolPath() {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found (run `make deps`)", name)
}

// AddTools adds the named programs and data paths to l, with the shared
// libraries of every ELF file added (found with ldd). When lddCache names a
// file, ldd's answers are kept there, keyed by each file's path, size and
// modification time, so that a rerun does not run ldd again.
func AddTools(ctx context.Context, l *Listing, tools, data []string, lddCache string) error {
	var files []string
	for _, name := range tools {
		p, err := LookTool(name)
		if err != nil {
			return fmt.Errorf("tools: %w", err)
		}
		got, err := l.AddHost(p)
		if err != nil {
			return fmt.Errorf("tools: %w", err)
		}
		files = append(files, got...)
	}
	for _, p := range data {
		if _, err := os.Lstat(p); os.IsNotExist(err) {
			continue // optional data (e.g. no /etc/ethertypes): the tools cope
		}
		got, err := l.AddHost(p)
		if err != nil {
			return fmt.Errorf("tools: %w", err)
		}
		files = append(files, got...)
	}
	cache := loadLddCache(lddCache)
	if err := addLibraries(ctx, l, files, cache); err != nil {
		return err
	}
	return cache.save()
}

// addLibraries adds the shared libraries of each dynamically linked ELF
// file in files.
func addLibraries(ctx context.Context, l *Listing, files []string, cache *lddCache) error {
	seen := make(map[string]bool)
	for _, f := range files {
		libs, err := cache.libraries(ctx, f)
		if err != nil {
			return err
		}
		for _, lib := range libs {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			if _, err := l.AddHost(lib); err != nil {
				return fmt.Errorf("library of %s: %w", f, err)
			}
		}
	}
	return nil
}

// lddCache remembers ldd's answer for each file.
type lddCache struct {
	path    string
	Entries map[string]lddEntry
	dirty   bool
}

type lddEntry struct {
	Size    int64
	ModTime int64
	Libs    []string
}

func loadLddCache(path string) *lddCache {
	c := &lddCache{path: path, Entries: make(map[string]lddEntry)}
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &c.Entries) != nil {
		c.Entries = make(map[string]lddEntry) // unreadable: start afresh
	}
	return c
}

func (c *lddCache) save() error {
	if !c.dirty || c.path == "" {
		return nil
	}
	b, err := json.Marshal(c.Entries)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(c.path, b, 0o644)
}

// libraries returns the libraries of f (none for a file that is not a
// dynamically linked ELF file).
func (c *lddCache) libraries(ctx context.Context, f string) ([]string, error) {
	fi, err := os.Stat(f)
	if err != nil {
		return nil, err
	}
	if e, ok := c.Entries[f]; ok && e.Size == fi.Size() && e.ModTime == fi.ModTime().UnixNano() {
		return e.Libs, nil
	}
	var libs []string
	if isELF(f) {
		if libs, err = ldd(ctx, f); err != nil {
			return nil, err
		}
	}
	c.Entries[f] = lddEntry{Size: fi.Size(), ModTime: fi.ModTime().UnixNano(), Libs: libs}
	c.dirty = true
	return libs, nil
}

func ldd(ctx context.Context, f string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", f).CombinedOutput()
	if bytes.Contains(out, []byte("not a dynamic executable")) || bytes.Contains(out, []byte("statically linked")) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w: %s", f, err, out)
	}
	libs, missing := ParseLdd(string(out))
	if len(missing) > 0 {
		return nil, fmt.Errorf("ldd %s: libraries not found: %s", f, strings.Join(missing, ", "))
	}
	return libs, nil
}

func isELF(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	_, err = f.Read(magic[:])
	return err == nil && string(magic[:]) == "\x7fELF"
}

// ParseLdd returns the absolute paths of the libraries (and the program
// interpreter) in ldd's output, and the names ldd could not resolve. The
// vDSO, which has no file, is left out.
func ParseLdd(out string) (libs, missing []string) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, after, arrow := strings.Cut(line, " => ")
		if arrow {
			if strings.HasPrefix(after, "not found") {
				missing = append(missing, name)
				continue
			}
			line = after
		}
		p, _, _ := strings.Cut(line, " (")
		if path.IsAbs(p) {
			libs = append(libs, p)
		}
	}
	return libs, missing
}
