package servicelb

import (
	"errors"
	"fmt"
)

// Validation errors. A *ValidationError wraps exactly one of them, so that
// callers test the kind of mistake with errors.Is and find the service and
// field with errors.As.
var (
	// ErrInvalidName: a service or port name that is empty where a name is
	// required, or a service, port or interface name that holds
	// characters kernel object names cannot carry.
	ErrInvalidName = errors.New("invalid name")
	// ErrNameTooLong: a name longer than MaxNameLen or MaxPortNameLen,
	// an interface name longer than MaxInterfaceNameLen or a prefix of
	// one longer than MaxInterfacePrefixLen.
	ErrNameTooLong = errors.New("name too long")
	// ErrInvalidAddress: an invalid, unspecified, loopback, multicast,
	// zoned or IPv4-mapped IPv6 address.
	ErrInvalidAddress = errors.New("invalid address")
	// ErrInvalidPrefix: a prefix that is invalid or has host bits set.
	ErrInvalidPrefix = errors.New("invalid prefix")
	// ErrFamilyMismatch: two cluster IPs of one family.
	ErrFamilyMismatch = errors.New("address family mismatch")
	// ErrDuplicateAddress: an address listed twice in one service.
	ErrDuplicateAddress = errors.New("duplicate address")
	// ErrInvalidPort: port 0, or a service without ports.
	ErrInvalidPort = errors.New("invalid port")
	// ErrNodePortRange: a node port outside NodeConfig's node port range.
	ErrNodePortRange = errors.New("node port outside the node port range")
	// ErrDuplicatePortName: two ports of one service with the same name.
	ErrDuplicatePortName = errors.New("duplicate port name")
	// ErrDuplicatePort: two ports of one service with the same port and
	// protocol, or the same node port and protocol, or a health check
	// node port that is also one of its TCP node ports.
	ErrDuplicatePort = errors.New("duplicate port")
	// ErrUnknownProtocol: a protocol other than TCP, UDP and SCTP.
	ErrUnknownProtocol = errors.New("unknown protocol")
	// ErrInvalidPolicy: a traffic policy other than Cluster and Local.
	ErrInvalidPolicy = errors.New("invalid traffic policy")
	// ErrAffinityTimeout: an affinity timeout outside 1s .. 24h, not a
	// whole number of seconds, or one without ClientIP affinity.
	ErrAffinityTimeout = errors.New("affinity timeout out of range")
	// ErrUnknownScheduler: a scheduler hint not in Schedulers().
	ErrUnknownScheduler = errors.New("unknown scheduler")
	// ErrUnsupported: something the backend cannot express (see
	// Capabilities), such as a scheduler hint it does not honour.
	ErrUnsupported = errors.New("not supported by the backend")
	// ErrCapacity: more than the backend can hold, such as more endpoints
	// for one service port than its layout has room for.
	ErrCapacity = errors.New("capacity of the backend exceeded")
	// ErrRefused: the kernel refused what a backend wrote for the
	// service, such as a rule it cannot load or an element it will not
	// take; the error wraps the kernel's. The backend leaves the service
	// out and applies the rest (SyncReport.LeftOut).
	ErrRefused = errors.New("refused by the kernel")
	// ErrInvalidNode: a NodeConfig field that is not valid, such as an
	// unknown local-traffic detection mode, a mode without its parameter,
	// or a parameter of another mode.
	ErrInvalidNode = errors.New("invalid node config")
)

// ValidationError says what is wrong with a service and where.
type ValidationError struct {
	// Service is the service's name; empty for a NodeConfig error.
	Service string
	// Field is the path of the offending field, such as "ports[1].nodePort".
	Field string
	// Value is the offending value, as text.
	Value string
	// Err is one of the Err* kinds above, possibly wrapping more detail.
	Err error
}

func (e *ValidationError) Error() string {
	who := "node config"
	if e.Service != "" || e.Field == "name" {
		who = fmt.Sprintf("service %q", e.Service)
	}
	if e.Value != "" {
		return fmt.Sprintf("%s: %s %s: %v", who, e.Field, e.Value, e.Err)
	}
	return fmt.Sprintf("%s: %s: %v", who, e.Field, e.Err)
}

func (e *ValidationError) Unwrap() error { return e.Err }

func invalid(svc, field string, value any, err error) *ValidationError {
	v := ""
	if value != nil {
		v = fmt.Sprint(value)
	}
	return &ValidationError{Service: svc, Field: field, Value: v, Err: err}
}

func invalidf(svc, field string, value any, kind error, format string, args ...any) *ValidationError {
	return invalid(svc, field, value, fmt.Errorf("%w: %s", kind, fmt.Sprintf(format, args...)))
}

// ServicesOf returns the services an error names, each with its part of
// the error, when every error it joins or wraps is a *ValidationError
// naming a service; else nil: an error that is not all about services.
func ServicesOf(err error) map[string]error {
	out := map[string]error{}
	if !collectServices(err, out) || len(out) == 0 {
		return nil
	}
	return out
}

func collectServices(err error, out map[string]error) bool {
	var ve *ValidationError
	if v, ok := err.(*ValidationError); ok {
		ve = v
	}
	switch {
	case ve != nil && ve.Service != "":
		out[ve.Service] = errors.Join(out[ve.Service], ve)
		return true
	case ve != nil:
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !collectServices(e, out) {
				return false
			}
		}
		return true
	}
	if u := errors.Unwrap(err); u != nil {
		return collectServices(u, out)
	}
	return false
}
