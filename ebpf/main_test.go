//go:build linux

package ebpf_test

import (
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestMain lets netnstest run asks from a process in a test's cgroup.
func TestMain(m *testing.M) { netnstest.Main(m) }
