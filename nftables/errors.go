package nftables

import "errors"

// Errors a Proxier returns before it sends anything to the kernel. Each is
// wrapped with the service port or option concerned; test for them with
// errors.Is.
var (
	// ErrUnsupported: a service asks for something this backend cannot
	// express, such as a scheduler other than random.
	ErrUnsupported = errors.New("not supported by the nftables backend")
	// ErrCapacity: a limit of the table's layout is reached: more than
	// 4095 endpoints for one service port, or more than 2^20 load-balanced
	// service ports of one family.
	ErrCapacity = errors.New("capacity of the nftables layout exceeded")
	// ErrInvalidOptions: an Options field is not valid.
	ErrInvalidOptions = errors.New("invalid nftables options")
	// ErrClosed: the Proxier was closed.
	ErrClosed = errors.New("nftables proxier closed")
)
