//go:build linux

package ipvs

import (
	"fmt"
	"log/slog"
)

// withDefaults returns o with defaults applied, or an error naming the
// first invalid field.
func (o Options) withDefaults() (Options, error) {
	if o.Interface == "" {
		o.Interface = DefaultInterface
	}
	if o.SetPrefix == "" {
		o.SetPrefix = DefaultSetPrefix
	}
	if o.ChainPrefix == "" {
		o.ChainPrefix = DefaultChainPrefix
	}
	if o.GracefulTimeout == 0 {
		o.GracefulTimeout = DefaultGracefulTimeout
	}
	if o.FWMarkMask == 0 {
		o.FWMarkMask = DefaultFWMarkMask
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := o.check(); err != nil {
		return o, err
	}
	return o, nil
}

func (o *Options) check() error {
	if len(o.Interface) > maxInterfaceLen || !validName(o.Interface) {
		return fmt.Errorf("%w: Interface %q: want 1-%d letters, digits and . _ -", ErrInvalidOptions, o.Interface, maxInterfaceLen)
	}
	if n := len(o.SetPrefix) + maxSetSuffixLen(); n > maxSetNameLen || !validName(o.SetPrefix) {
		return fmt.Errorf("%w: SetPrefix %q: want letters, digits and . _ - and at most %d bytes",
			ErrInvalidOptions, o.SetPrefix, maxSetNameLen-maxSetSuffixLen())
	}
	if n := len(o.ChainPrefix) + maxChainSuffixLen(); n > maxChainNameLen || !validName(o.ChainPrefix) {
		return fmt.Errorf("%w: ChainPrefix %q: want letters, digits and . _ - and at most %d bytes",
			ErrInvalidOptions, o.ChainPrefix, maxChainNameLen-maxChainSuffixLen())
	}
	if o.GracefulTimeout < 0 {
		return fmt.Errorf("%w: GracefulTimeout %s is negative", ErrInvalidOptions, o.GracefulTimeout)
	}
	return nil
}

// validName reports whether s holds only characters every kernel object
// name and rendering can carry unquoted.
func validName(s string) bool {
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
