package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// DefaultTools are the host programs copied into the guest: busybox for the
// shell and basic commands, kmod's modprobe, and the oracle tools that
// tests run to read kernel state back. The iptables names are symlinks to
// xtables-nft-multi; they are copied as such.
var DefaultTools = []string{
	"busybox", "modprobe",
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
// libraries of every ELF file added (found with ldd).
func AddTools(ctx context.Context, l *Listing, tools, data []string) error {
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
	return addLibraries(ctx, l, files)
}

// addLibraries adds the shared libraries of each dynamically linked ELF
// file in files.
func addLibraries(ctx context.Context, l *Listing, files []string) error {
	seen := make(map[string]bool)
	for _, f := range files {
		if !isELF(f) {
			continue
		}
		out, err := exec.CommandContext(ctx, "ldd", f).CombinedOutput()
		if bytes.Contains(out, []byte("not a dynamic executable")) || bytes.Contains(out, []byte("statically linked")) {
			continue
		}
		if err != nil {
			return fmt.Errorf("ldd %s: %w: %s", f, err, out)
		}
		libs, missing := ParseLdd(string(out))
		if len(missing) > 0 {
			return fmt.Errorf("ldd %s: libraries not found: %s", f, strings.Join(missing, ", "))
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
