//go:build linux

package iptables

import (
	"context"
	"errors"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// offlineConn refuses to talk to a kernel: for tests that only render.
type offlineConn struct{}

var errOffline = errors.New("offline")

func (offlineConn) Generation(context.Context) (nfnl.Generation, error) {
	return nfnl.Generation{}, errOffline
}

func (offlineConn) Commit(context.Context, *nfnl.Batch) (nfnl.Generation, error) {
	return nfnl.Generation{}, errOffline
}

func (offlineConn) Tables(context.Context, nfnl.Family) ([]nfnl.Table, error) {
	return nil, errOffline
}

func (offlineConn) Chains(context.Context, nfnl.Family, string) ([]nfnl.Chain, error) {
	return nil, errOffline
}

func (offlineConn) EachRule(context.Context, nfnl.Family, string, string, func(*nfnl.Rule) error) error {
	return errOffline
}
