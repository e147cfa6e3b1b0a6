//go:build linux

package conformance

import (
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// Main runs the package's tests. A backend whose test sets Backend.Cgroup
// must call it from its TestMain, since the kit then starts the test
// binary again inside the cgroup to make the node's and the pod's asks
// there, and Main turns that process into the one that asks:
//
//	func TestMain(m *testing.M) { conformance.Main(m) }
//
// Without Backend.Cgroup it is m.Run with os.Exit, and costs nothing.
func Main(m *testing.M) { netnstest.Main(m) }
