//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/ipvsnl"
	"github.com/kproxy-dev/kproxy/internal/privilege"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/ipset"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Probe checks, changing nothing, that a Proxier with these options can
// work: the options are valid (ErrInvalidOptions), the process may
// program Options.NetNS (else servicelb.ErrPermission), and the kernel
// has what the Proxier uses there (else a *servicelb.FeatureError naming
// the first missing, errors.Is ErrNotSupported): IPVS, ipset, nf_tables
// with nft_compat and the xtables extensions of its rules, and the dummy
// link driver. It asks IPVS for its version, ipset for its protocol and
// nf_tables for the ruleset's generation and each extension's revision;
// the kernel may load the modules that answer, as New and the first Sync
// would. The dummy driver is looked for among the modules loaded, built
// in or installed, as modprobe would find it.
func Probe(o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return fmt.Errorf("ipvs: %w", err)
	}
	if err := probe(o); err != nil {
		return fmt.Errorf("ipvs: probe: %w", err)
	}
	return nil
}

func probe(o Options) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ns, err := dupNS(o.NetNS)
	if err != nil {
		return err
	}
	defer ns.Close()
	at, err := socketNS(ns)
	if err != nil {
		return err
	}
	ctx := context.Background()
	h, err := ipvsnl.Open(ctx, ipvsnl.Options{NetNS: int(at)})
	if err == nil {
		err = h.Info(ctx)
		h.Close()
	}
	const hint = "a kernel with CONFIG_IP_VS (modprobe ip_vs)"
	if errors.Is(err, ipvsnl.ErrNotAvailable) {
		return &servicelb.FeatureError{Feature: "IPVS", Hint: hint, Err: err}
	}
	if err := privilege.Feature(err, "IPVS", hint); err != nil {
		return err
	}
	sets, err := ipset.New(ipset.Options{NetNS: at, Prefix: o.SetPrefix})
	if err == nil {
		err = sets.Probe(ctx)
		sets.Close()
	}
	if err := privilege.Feature(err, "ipset", "a kernel with CONFIG_IP_SET and its hash types (modprobe ip_set)"); err != nil {
		return err
	}
	feature, err := xtables.Probe(ctx, int(at), true)
	if err := privilege.Feature(err, feature, "a kernel with CONFIG_NF_TABLES, CONFIG_NFT_COMPAT and the extension (modprobe nft_compat)"); err != nil {
		return err
	}
	if !kernelHas("dummy") {
		return &servicelb.FeatureError{Feature: "dummy links", Hint: "a kernel with CONFIG_DUMMY (modprobe dummy)"}
	}
	return nil
}

// kernelHas reports whether a kernel module is loaded, built in, or
// installed where modprobe would find it.
func kernelHas(module string) bool {
	if _, err := os.Stat("/sys/module/" + module); err == nil {
		return true
	}
	var uts unix.Utsname
	if unix.Uname(&uts) != nil {
		return false
	}
	base := filepath.Join("/lib/modules", unix.ByteSliceToString(uts.Release[:]))
	if b, err := os.ReadFile(filepath.Join(base, "modules.builtin")); err == nil && strings.Contains(string(b), "/"+module+".ko") {
		return true
	}
	matches, _ := filepath.Glob(filepath.Join(base, "kernel/drivers/net", module+".ko*"))
	return len(matches) > 0
}
