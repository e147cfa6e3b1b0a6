package sandbox

import "testing"

func TestOwnerPid(t *testing.T) {
	for _, tc := range []struct {
		name string
		pid  int
		ok   bool
	}{
		{"kpxsb-123-abcdef-node", 123, true},
		{"kpxsb-7-x-backend-1", 7, true},
		{"kpxsb--x", 0, false},
		{"kpxsb-0-x", 0, false},
		{"other-123-x", 0, false},
		{"kpxsb-abc-x", 0, false},
	} {
		pid, ok := ownerPid(tc.name)
		if pid != tc.pid || ok != tc.ok {
			t.Errorf("ownerPid(%q) = %d, %v; want %d, %v", tc.name, pid, ok, tc.pid, tc.ok)
		}
	}
}
