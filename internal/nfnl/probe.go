//go:build linux

package nfnl

import (
	"context"
	"fmt"
)

// The nft_compat subsystem of nfnetlink: the xtables matches and targets
// that rules in iptables-nft's encoding call.
const (
	subsysNFTCompat = 11 // NFNL_SUBSYS_NFT_COMPAT
	msgCompatGet    = 0  // NFNL_MSG_COMPAT_GET
	attrCompatName  = 1  // NFTA_COMPAT_NAME
	attrCompatRev   = 2  // NFTA_COMPAT_REV
	attrCompatType  = 3  // NFTA_COMPAT_TYPE: 1 a target, 0 a match
)

// Extension asks the kernel whether it has the xtables match (or, with
// target set, the target) name at revision rev for family, as iptables
// asks before it writes a rule that calls it. It changes nothing; the
// kernel may load the module that provides it, as a rule calling it
// would. An error means it has not, or that the request was refused.
func (c *Conn) Extension(ctx context.Context, fam Family, name string, rev uint32, target bool) error {
	typ := uint32(0)
	if target {
		typ = 1
	}
	err := c.requestOf(ctx, subsysNFTCompat, msgCompatGet, fam, false, func(e *encoder) {
		e.str(attrCompatName, name)
		e.u32(attrCompatRev, rev)
		e.u32(attrCompatType, typ)
	}, func([]byte) error { return nil })
	if err != nil {
		kind := "match"
		if target {
			kind = "target"
		}
		return fmt.Errorf("nfnl: xtables %s %s revision %d: %w", kind, name, rev, err)
	}
	return nil
}

// Probe asks the kernel, in the namespace of o, for the ruleset's
// generation: a request that changes nothing and that the kernel answers
// only when it has nf_tables and the caller CAP_NET_ADMIN there.
func Probe(ctx context.Context, o Options) error {
	c, err := Open(o)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Generation(ctx)
	return err
}
