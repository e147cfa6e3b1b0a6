//go:build linux

package testservers

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"
)

// ConsulAgent is a running Consul agent in -dev mode: a single server that
// keeps its state in memory.
type ConsulAgent struct {
	// Addr is the HTTP API's address, 127.0.0.1:<port>.
	Addr string
	// HTTPSAddr is the HTTPS API's address, 127.0.0.1:<port>, with
	// ConsulOptions.TLS; empty without.
	HTTPSAddr string

	dir string
	p   *proc
}

// ConsulOptions add security to a dev agent.
type ConsulOptions struct {
	// ACLToken, when set, turns ACLs on with the default policy deny, and
	// is the initial management token.
	ACLToken string
	// TLS, when set, serves the HTTP API over TLS too (HTTPSAddr), with
	// these files, and requires a client certificate signed by the CA.
	TLS *TLSFiles
}

// StartConsul starts a Consul dev agent on free ports of 127.0.0.1, with
// DNS and gRPC off, and waits until it has elected itself leader. Stop ends
// it.
func StartConsul(ctx context.Context) (*ConsulAgent, error) {
	return StartConsulWith(ctx, ConsulOptions{})
}

// StartConsulWith starts a Consul dev agent as StartConsul does, with ACLs
// and an HTTPS API as o says.
func StartConsulWith(ctx context.Context, o ConsulOptions) (c *ConsulAgent, err error) {
	bin, err := Consul.Binary(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := tempDir("consul")
	if err != nil {
		return nil, err
	}
	c = &ConsulAgent{dir: dir}
	defer func() {
		if err != nil {
			c.Stop()
			c = nil
		}
	}()
	ports, err := freePorts(6)
	if err != nil {
		return c, err
	}
	c.Addr = "127.0.0.1:" + strconv.Itoa(ports[0])
	args := []string{"agent", "-dev",
		"-bind", "127.0.0.1", "-client", "127.0.0.1", "-advertise", "127.0.0.1",
		"-http-port", strconv.Itoa(ports[0]), "-serf-lan-port", strconv.Itoa(ports[1]),
		"-serf-wan-port", strconv.Itoa(ports[2]), "-server-port", strconv.Itoa(ports[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1",
		"-node", "consul-test", "-log-level", "warn"}
	if o.ACLToken != "" {
		args = append(args, "-hcl", fmt.Sprintf(`acl { enabled = true
default_policy = "deny"
tokens { initial_management = %q } }`, o.ACLToken))
	}
	if o.TLS != nil {
		c.HTTPSAddr = "127.0.0.1:" + strconv.Itoa(ports[4])
		args = append(args, "-https-port", strconv.Itoa(ports[4]), "-hcl", fmt.Sprintf(`tls { https {
ca_file = %q
cert_file = %q
key_file = %q
verify_incoming = true } }`, o.TLS.CA, o.TLS.ServerCert, o.TLS.ServerKey))
	}
	c.p, err = start("consul", dir, bin, args...)
	if err != nil {
		return c, err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// /v1/status/leader answers 200 at once; the catalog answers only once
	// a leader is elected (and, with ACLs, once they are bootstrapped).
	return c, waitHTTP(wctx, c.p, "http://"+c.Addr+"/v1/catalog/nodes", o.ACLToken)
}

// Stop ends the agent, by pid, and removes its files.
func (c *ConsulAgent) Stop() {
	if c == nil {
		return
	}
	c.p.stop()
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

// Logs returns the tail of the agent's log, for a failing test.
func (c *ConsulAgent) Logs() string {
	if c.p == nil {
		return ""
	}
	b, _ := os.ReadFile(c.p.log)
	return tail(string(b), 30)
}
