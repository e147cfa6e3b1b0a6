//go:build privileged

package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/internal/testkit/testservers"
)

// kproxy reaches a Consul agent that denies by ACL and requires client
// certificates on its HTTPS API: with the token (--consul-token or
// CONSUL_HTTP_TOKEN), the CA, the client certificate and the server's name
// it prints the rules of the mapped service; without the token it sees no
// service; without the client certificate or the server's name it cannot
// query, and says why.
func TestConsulACLAndTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	// The certificate names the server only by name: 127.0.0.1 does not
	// verify without --consul-tls-server-name.
	files, err := testservers.WriteTLSFiles(dir, "server.dc1.consul")
	require.NoError(t, err)
	const token = "2f4b3b1c-0d5e-4e7a-9a59-3c1f5d0e8b21"
	agent, err := testservers.StartConsulWith(ctx, testservers.ConsulOptions{ACLToken: token, TLS: files})
	if err != nil {
		testutil.SkipOrFail(t, "consul: "+err.Error())
	}
	defer agent.Stop()

	c, err := api.NewClient(&api.Config{Address: agent.Addr, Token: token})
	require.NoError(t, err)
	for id, addr := range map[string]string{"web-1": "10.100.1.2", "web-2": "10.100.2.2"} {
		require.NoError(t, c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: id, Name: "web", Address: addr, Port: 8080}))
	}
	mapping := filepath.Join(dir, "mapping.yaml")
	require.NoError(t, os.WriteFile(mapping, []byte("services:\n  web: {vip: 10.96.0.20, port: 80}\n"), 0o644))

	base := []string{"--source", "consul", "--consul-addr", agent.HTTPSAddr, "--consul-mapping", mapping,
		"--backend", "iptables", "--dry-run", "--once"}
	tlsFlags := []string{"--consul-ca-file", files.CA, "--consul-client-cert", files.ClientCert,
		"--consul-client-key", files.ClientKey, "--consul-tls-server-name", files.ServerName}
	withArgs := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	rules := []string{"-d 10.96.0.20/32", "--to-destination 10.100.1.2:8080", "--to-destination 10.100.2.2:8080"}

	code, out, logs := run(t, withArgs(base, tlsFlags, []string{"--consul-token", token})...)
	require.Equal(t, 0, code, logs)
	for _, want := range rules {
		has(t, out, want, "--consul-token")
	}

	t.Setenv("CONSUL_HTTP_TOKEN", token)
	code, out, logs = run(t, withArgs(base, tlsFlags)...)
	require.Equal(t, 0, code, logs)
	has(t, out, rules[0], "CONSUL_HTTP_TOKEN")

	t.Setenv("CONSUL_HTTP_TOKEN", "")
	code, out, logs = run(t, withArgs(base, tlsFlags)...)
	require.Equal(t, 0, code, logs)
	assert.NotContains(t, out, "10.96.0.20", "without a token, the ACLs hide the service")

	noCert := []string{"--consul-ca-file", files.CA, "--consul-tls-server-name", files.ServerName, "--consul-token", token}
	code, out, logs = runFor(t, 3*time.Second, withArgs(base, noCert)...)
	assert.Equal(t, 0, code)
	assert.NotContains(t, out, "10.96.0.20")
	// Under TLS 1.3 the server refuses a client without a certificate
	// after the client's side of the handshake is done: the client reads
	// the server's alert, a reset when the server closed first, or a
	// broken pipe when it closed before the client wrote its request.
	assert.Regexp(t, `remote error: tls: certificate required|connection reset by peer|write: broken pipe`, logs, "without a client certificate")

	noName := []string{"--consul-ca-file", files.CA, "--consul-client-cert", files.ClientCert,
		"--consul-client-key", files.ClientKey, "--consul-token", token}
	code, out, logs = runFor(t, 3*time.Second, withArgs(base, noName)...)
	assert.Equal(t, 0, code)
	assert.NotContains(t, out, "10.96.0.20")
	assert.Contains(t, logs, "cannot validate certificate for 127.0.0.1", "without the server's name")
}
