package suite

import (
	"regexp"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Limit is a test a kproxy backend fails by a limit it declares: in its
// package documentation and in its capabilities (servicelb.Features),
// which tell its users and the conformance kit the same.
type Limit struct {
	// Proxy is the column, such as kproxy-userspace.
	Proxy string
	// Spec matches the test's full text.
	Spec *regexp.Regexp
	// Feature is the capability the backend declares it lacks.
	Feature servicelb.Features
	// Why says what the test needs that the backend does not do, and
	// where the backend's documentation says so.
	Why string
}

// Limits are the declared limits. A test that matches one is not a
// regression: the report says why instead.
var Limits = []Limit{}

// Declared returns the limit of the proxy that covers the test, or nil.
func Declared(proxy, spec string) *Limit {
	for i, l := range Limits {
		if l.Proxy == proxy && l.Spec.MatchString(spec) {
			return &Limits[i]
		}
	}
	return nil
}
