//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestTracedErrors: the kernel's refusals of a batch's requests are each
// traced to the service port they serve, all of them (beyond the few
// errors a batch reports otherwise), one error per port, so that a sync
// leaves every such service out at once. A request for a virtual server
// that is gone (ESRCH), one that serves no port, and the error that
// stopped the batch are no refusal of a service: the error is not all
// about services, and the sync fails.
func TestTracedErrors(t *testing.T) {
	owner := map[vsKey]servicelb.ServicePortKey{}
	var ops []ipvsOp
	var errs []error
	refuse := func(o ipvsOp, errno unix.Errno) error {
		return opErr(opNames[o.kind], o.object(), &nl.Error{Errno: errno})
	}
	for i := range 8 {
		vs := &VirtualServer{Addr: netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), Protocol: servicelb.TCP, Port: 80}
		owner[vs.key()] = servicelb.ServicePortKey{Service: fmt.Sprintf("default/s%d", i), Port: "http", Family: servicelb.IPv4}
		for j := range 2 {
			o := ipvsOp{kind: newReal, vs: vs, r: RealServer{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j + 1)}), Port: 8080, Weight: 1}}
			ops = append(ops, o)
			errs = append(errs, refuse(o, unix.EINVAL))
		}
	}
	errs[1] = nil // s0's other real server went in

	err := tracedErrors(ops, errs, nil, owner)
	bad := servicelb.ServicesOf(err)
	require.Len(t, bad, 8, "every refused service: %v", err)
	for name, e := range bad {
		assert.ErrorIs(t, e, servicelb.ErrRefused, name)
		assert.ErrorIs(t, e, unix.EINVAL, name)
		assert.ErrorIs(t, e, ErrKernel, name)
	}
	var joined interface{ Unwrap() []error }
	require.True(t, errors.As(err, &joined))
	assert.Len(t, joined.Unwrap(), 8, "one error per service port")
	assert.Contains(t, bad["default/s3"].Error(), `service "default/s3": ports default/s3:http/ipv4: refused by the kernel: add real server -t 10.96.0.4:80 -r 10.244.3.1:8080: invalid argument`)

	gone := append([]error(nil), errs...)
	gone[4] = refuse(ops[4], unix.ESRCH)
	err = tracedErrors(ops, gone, nil, owner)
	assert.Nil(t, servicelb.ServicesOf(err), "a virtual server someone removed")
	assert.ErrorIs(t, err, unix.ESRCH)

	err = tracedErrors(ops, errs, nil, nil)
	assert.Nil(t, servicelb.ServicesOf(err), "requests of no service port")
	assert.ErrorContains(t, err, "and 10 more requests failed")

	stopped := []error{refuse(ops[0], unix.EINVAL), nl.ErrUnknown}
	err = tracedErrors(ops[:2], stopped, context.Canceled, owner)
	assert.Nil(t, servicelb.ServicesOf(err), "a batch that stopped")
	assert.ErrorIs(t, err, context.Canceled)

	assert.NoError(t, tracedErrors(ops[:2], []error{nil, nil}, nil, owner))
}
