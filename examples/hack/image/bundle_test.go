package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A CA bundle must hold certificates and nothing else: a key, text that
// is not PEM, or an empty file is refused before anything is written.
func TestCABundleRefused(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"empty":    "",
		"not pem":  "hello\n",
		"a key":    "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
		"bad cert": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
	} {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
		_, err := readCABundle(path)
		assert.ErrorContains(t, err, "CA bundle "+path, name)
	}
	_, err := readCABundle(filepath.Join(dir, "none"))
	assert.ErrorContains(t, err, "--ca-bundle")
	if _, err := os.Stat(DefaultCABundle); err == nil {
		b, err := readCABundle(DefaultCABundle)
		require.NoError(t, err)
		assert.NotEmpty(t, b)
	}
}
