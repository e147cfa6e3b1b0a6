// Package sysctl reads and writes kernel settings under /proc/sys in a
// network namespace, for the backends and packages that need some: IPVS's
// own settings, localhost node ports' route_localnet, conntrack tuning.
package sysctl

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/nsutil"
)

// Setting is one kernel setting: Name in dotted form, as the sysctl tool
// writes it ("net.ipv4.vs.conntrack"), and the value wanted.
type Setting struct {
	Name, Value string
}

func (s Setting) path() string { return "/proc/sys/" + strings.ReplaceAll(s.Name, ".", "/") }

func (s Setting) String() string { return s.Name + "=" + s.Value }

// Change is a setting whose value differed: Old is what the kernel held.
type Change struct {
	Setting
	Old string
}

// ErrNotSettable: the kernel does not let the namespace change the
// setting (most often one the kernel keeps for the initial namespace only,
// which other namespaces see read-only).
var ErrNotSettable = errors.New("not settable in this network namespace")

// Error is a setting that could not be read or written.
type Error struct {
	// Op is "read" or "write".
	Op      string
	Setting Setting
	Err     error
}

func (e *Error) Error() string {
	if e.Op == "write" {
		return fmt.Sprintf("sysctl: write %s: %v", e.Setting, e.Err)
	}
	return fmt.Sprintf("sysctl: read %s: %v", e.Setting.Name, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Get returns the value of the setting name in ns (zero: the caller's
// namespace).
func Get(ns netns.NsHandle, name string) (string, error) {
	var v string
	err := nsutil.Do(ns, func() (err error) {
		v, err = read(Setting{Name: name})
		return err
	})
	return v, err
}

// Differing returns the settings whose value in ns differs from the one
// wanted, and changes nothing.
func Differing(ns netns.NsHandle, settings []Setting) ([]Change, error) {
	return walk(ns, settings, false)
}

// Apply writes, in ns, every setting whose value differs, and returns the
// ones it changed. It tries them all; the error joins one *Error for each
// that failed. A setting the namespace sees read-only fails with
// ErrNotSettable.
func Apply(ns netns.NsHandle, settings []Setting) ([]Change, error) {
	return walk(ns, settings, true)
}

func walk(ns netns.NsHandle, settings []Setting, write bool) ([]Change, error) {
	var changed []Change
	var errs []error
	err := nsutil.Do(ns, func() error {
		for _, s := range settings {
			old, err := read(s)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if old == s.Value {
				continue
			}
			if write {
				if err := os.WriteFile(s.path(), []byte(s.Value), 0o644); err != nil {
					if errors.Is(err, os.ErrPermission) {
						err = fmt.Errorf("%w: %w", ErrNotSettable, err)
					}
					errs = append(errs, &Error{Op: "write", Setting: s, Err: err})
					continue
				}
			}
			changed = append(changed, Change{Setting: s, Old: old})
		}
		return nil
	})
	return changed, errors.Join(append(errs, err)...)
}

func read(s Setting) (string, error) {
	b, err := os.ReadFile(s.path())
	if err != nil {
		return "", &Error{Op: "read", Setting: s, Err: err}
	}
	return strings.TrimSpace(string(b)), nil
}

// StrictARP are the settings that keep a node from claiming, on its links,
// the addresses it holds for services on another link (a dummy link or
// loopback): arp_ignore=1 answers an ARP request only for an address of
// the link it came in on, and arp_announce=2 makes the node's own ARP
// requests name an address of the link they leave by, never a held one.
// Neighbours and load-balancer announcers (keepalived, MetalLB's L2 mode)
// then keep those addresses. IPv6 needs nothing: a node answers neighbour
// solicitations only for the addresses of the link they come in on.
func StrictARP() []Setting {
	return []Setting{
		{Name: "net.ipv4.conf.all.arp_ignore", Value: "1"},
		{Name: "net.ipv4.conf.all.arp_announce", Value: "2"},
	}
}
