package iptables

import (
	"context"
	"errors"
)

// offlineConn refuses to talk to a kernel: for tests that only render.
type offlineConn struct{}

var errOffline = errors.New("offline")

func (offlineConn) GenID(context.Context) (uint32, error)                   { return 0, errOffline }
func (offlineConn) Batch(context.Context, []byte, uint32) ([][]byte, error) { return nil, errOffline }
func (offlineConn) Dump(context.Context, []byte) ([][]byte, error)          { return nil, errOffline }
