//go:build linux

package iptables

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func (o *Options) normalize() error {
	if o.ChainPrefix == "" {
		o.ChainPrefix = DefaultChainPrefix
	}
	if err := checkPrefix(o.ChainPrefix); err != nil {
		return err
	}
	if len(o.Families) == 0 {
		o.Families = []servicelb.Family{servicelb.IPv4, servicelb.IPv6}
	}
	for _, f := range o.Families {
		if f != servicelb.IPv4 && f != servicelb.IPv6 {
			return fmt.Errorf("%w: family %s", ErrInvalidOptions, f)
		}
	}
	o.Families = slices.Compact(slices.Sorted(slices.Values(o.Families)))
	if o.DropBit == 0 {
		o.DropBit = DefaultDropBit
	}
	if o.DropBit > 31 {
		return fmt.Errorf("%w: drop bit %d: want 0-31", ErrInvalidOptions, o.DropBit)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

func (o *Options) dropMark() uint32 { return 1 << o.DropBit }
