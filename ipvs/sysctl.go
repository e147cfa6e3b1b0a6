package ipvs

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
)

// sysctl is one setting the proxier needs, as a path under /proc/sys.
type sysctl struct {
	path, value string
}

// sysctls returns the settings the proxier needs in its namespace:
// conntrack for IPVS connections (so that the helper rules masquerade
// them), expiry of connections whose real server is gone, and of
// persistence templates of draining real servers; with StrictARP, no ARP
// answers for the dummy link's addresses on other links.
func (p *Proxier) sysctls() []sysctl {
	out := []sysctl{
		{"net/ipv4/vs/conntrack", "1"},
		{"net/ipv4/vs/expire_nodest_conn", "1"},
		{"net/ipv4/vs/expire_quiescent_template", "1"},
	}
	if p.opts.StrictARP {
		out = append(out, sysctl{"net/ipv4/conf/all/arp_ignore", "1"}, sysctl{"net/ipv4/conf/all/arp_announce", "2"})
	}
	return out
}

// ensureSysctls writes the settings that differ, or with LeaveSysctls
// reports them.
func (p *Proxier) ensureSysctls() error {
	return inNamespace(p.ns, func() error {
		var errs []error
		for _, s := range p.sysctls() {
			name := "/proc/sys/" + s.path
			b, err := os.ReadFile(name)
			if err != nil {
				errs = append(errs, fmt.Errorf("%w: read %s: %v", ErrSysctl, s.path, err))
				continue
			}
			if strings.TrimSpace(string(b)) == s.value {
				continue
			}
			if p.opts.LeaveSysctls {
				errs = append(errs, fmt.Errorf("%w: %s is %s, want %s (Options.LeaveSysctls is set)",
					ErrSysctl, s.path, strings.TrimSpace(string(b)), s.value))
				continue
			}
			if err := os.WriteFile(name, []byte(s.value), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("%w: write %s=%s: %v", ErrSysctl, s.path, s.value, err))
				continue
			}
			p.log.Info("ipvs: sysctl set", "sysctl", strings.ReplaceAll(s.path, "/", "."), "value", s.value)
		}
		return errors.Join(errs...)
	})
}

// inNamespace runs f on an OS thread switched into ns. The calling
// goroutine's thread never changes namespace; if the thread cannot be
// switched back, it is discarded.
func inNamespace(ns netns.NsHandle, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			// Still locked: the thread ends with this goroutine.
			done <- errors.Join(ferr, fmt.Errorf("leave network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}
