//go:build linux

package netnstest

import "testing"

// TestMain lets StartCgroup run its asker from this test binary.
func TestMain(m *testing.M) { Main(m) }
