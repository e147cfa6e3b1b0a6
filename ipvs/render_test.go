//go:build linux

package ipvs

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestForRendering: a Proxier for rendering needs no kernel, renders as
// the package-level Render does, declares the capabilities of its
// options (strict ARP's answer), and refuses to sync or clean up.
func TestForRendering(t *testing.T) {
	for _, strict := range []bool{false, true} {
		p, err := ForRendering(Options{StrictARP: strict})
		require.NoError(t, err)
		st := mustState(t, testNode(), renderCases()["clusterip"]...)
		got, err := p.Render(st)
		require.NoError(t, err)
		want, err := Render(st, Options{StrictARP: strict})
		require.NoError(t, err)
		assert.Equal(t, want, got)
		assert.Equal(t, strict, p.Capabilities().Features&servicelb.FeatureNoARPAnswers != 0, "strict ARP %v", strict)
		assert.ErrorIs(t, servicetest.SyncErr(p.Sync(context.Background(), st)), servicelb.ErrRenderOnly)
		assert.ErrorIs(t, p.Cleanup(context.Background()), servicelb.ErrRenderOnly)
		assert.NoError(t, p.Close())
		assert.NoError(t, p.Close())
	}
}
