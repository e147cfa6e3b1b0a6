//go:build linux

package userspace

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/privilege"
	"github.com/kproxy-dev/kproxy/internal/rtnl"
)

// Probe checks, changing nothing, that a Proxier with these options can
// work: the options are valid (ErrInvalidOptions) and the process has the
// privileges they take (else servicelb.ErrPermission): CAP_NET_ADMIN to
// hold addresses, CAP_SYS_ADMIN to serve another network namespace. With
// Options.HoldAddresses it also reads the namespace's loopback link
// through route netlink, as the first Sync would. Serving sockets needs
// nothing of the kernel that every Linux lacks.
func Probe(o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	if o.HoldAddresses {
		if err := privilege.Require("userspace: Options.HoldAddresses", privilege.NetAdmin); err != nil {
			return err
		}
	}
	if otherNS(o.NetNS) {
		if err := privilege.Require("userspace: Options.NetNS (another network namespace)", privilege.SysAdmin); err != nil {
			return err
		}
	}
	if !o.HoldAddresses {
		return nil
	}
	rt, err := rtnl.Open(o.NetNS)
	if err == nil {
		_, _, err = rt.LinkByName(context.Background(), "lo")
		rt.Close()
	}
	if err := privilege.Feature(err, "route netlink", "a kernel with CONFIG_NET"); err != nil {
		return fmt.Errorf("userspace: probe: %w", err)
	}
	return nil
}
