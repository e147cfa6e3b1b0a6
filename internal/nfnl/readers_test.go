//go:build linux

package nfnl

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The kernel waits for its readers through membarrier's global command,
// rather than AwaitReaders falling back to a pause.
func TestAwaitReadersUsesMembarrier(t *testing.T) {
	require.NoError(t, awaitGracePeriod())
}
