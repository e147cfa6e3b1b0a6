package testservers

import (
	"context"
	"os"
	"strconv"
	"time"
)

// ConsulAgent is a running Consul agent in -dev mode: a single server that
// keeps its state in memory.
type ConsulAgent struct {
	// Addr is the HTTP API's address, 127.0.0.1:<port>.
	Addr string

	dir string
	p   *proc
}

// StartConsul starts a Consul dev agent on free ports of 127.0.0.1, with
// DNS and gRPC off, and waits until it has elected itself leader. Stop ends
// it.
func StartConsul(ctx context.Context) (c *ConsulAgent, err error) {
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
	ports, err := freePorts(5)
	if err != nil {
		return c, err
	}
	c.Addr = "127.0.0.1:" + strconv.Itoa(ports[0])
	c.p, err = start("consul", dir, bin, "agent", "-dev",
		"-bind", "127.0.0.1", "-client", "127.0.0.1", "-advertise", "127.0.0.1",
		"-http-port", strconv.Itoa(ports[0]), "-serf-lan-port", strconv.Itoa(ports[1]),
		"-serf-wan-port", strconv.Itoa(ports[2]), "-server-port", strconv.Itoa(ports[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1",
		"-node", "consul-test", "-log-level", "warn")
	if err != nil {
		return c, err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// /v1/status/leader answers 200 at once; the catalog answers only once
	// a leader is elected.
	return c, waitHTTP(wctx, c.p, "http://"+c.Addr+"/v1/catalog/nodes", "")
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
