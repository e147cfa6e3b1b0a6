//go:build linux

package ipvs

import (
	"errors"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/sysctl"
)

// sysctls returns the settings the proxier needs in its namespace:
// conntrack for IPVS connections (so that the helper rules masquerade
// them), expiry of connections whose real server is gone, and of
// persistence templates of draining real servers; with StrictARP, no ARP
// answers for the dummy link's addresses on other links.
func (p *Proxier) sysctls() []sysctl.Setting {
	out := []sysctl.Setting{
		{Name: "net.ipv4.vs.conntrack", Value: "1"},
		{Name: "net.ipv4.vs.expire_nodest_conn", Value: "1"},
		{Name: "net.ipv4.vs.expire_quiescent_template", Value: "1"},
	}
	if p.opts.StrictARP {
		out = append(out, sysctl.StrictARP()...)
	}
	return out
}

// ensureSysctls writes the settings that differ, or with LeaveSysctls
// reports them.
func (p *Proxier) ensureSysctls() error {
	if p.opts.LeaveSysctls {
		differ, err := sysctl.Differing(p.ns, p.sysctls())
		errs := []error{}
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrSysctl, err))
		}
		for _, c := range differ {
			errs = append(errs, fmt.Errorf("%w: %s is %s, want %s (Options.LeaveSysctls is set)", ErrSysctl, c.Name, c.Old, c.Value))
		}
		return errors.Join(errs...)
	}
	changed, err := sysctl.Apply(p.ns, p.sysctls())
	for _, c := range changed {
		p.log.Info("ipvs: sysctl set", "sysctl", c.Name, "value", c.Value, "was", c.Old)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSysctl, err)
	}
	return nil
}
