package main

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"
)

// topo is three network namespaces of the bench's own: the node (where a
// proxier runs), a client and a backend that holds the addresses of the
// probed services' endpoints, joined to the node by veth pairs:
//
//	client 198.51.100.2 -- 198.51.100.1 node 192.0.2.1 -- 192.0.2.2 backend
//
// Nothing outside them is touched; close deletes them.
type topo struct {
	node, client, backend string
	server                *exec.Cmd
}

var topoCount int

func newTopo(probedEndpoints []netip.Addr) (*topo, error) {
	topoCount++
	base := "kpbench-" + strconv.Itoa(os.Getpid()) + "-" + strconv.Itoa(topoCount)
	t := &topo{node: base + "-node", client: base + "-client", backend: base + "-backend"}
	if err := t.build(probedEndpoints); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *topo) build(eps []netip.Addr) error {
	for _, ns := range []string{t.node, t.client, t.backend} {
		if err := sh("ip", "netns", "add", ns); err != nil {
			return err
		}
		if err := sh("ip", "-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	steps := [][]string{
		{"ip", "-n", t.node, "link", "add", "to-client", "type", "veth", "peer", "name", "eth0", "netns", t.client},
		{"ip", "-n", t.node, "link", "add", "to-backend", "type", "veth", "peer", "name", "eth0", "netns", t.backend},
		{"ip", "-n", t.node, "addr", "add", "198.51.100.1/24", "dev", "to-client"},
		{"ip", "-n", t.node, "addr", "add", benchwork.NodeIP + "/24", "dev", "to-backend"},
		{"ip", "-n", t.client, "addr", "add", "198.51.100.2/24", "dev", "eth0"},
		{"ip", "-n", t.backend, "addr", "add", "192.0.2.2/24", "dev", "eth0"},
	}
	for _, ns := range []string{t.client, t.backend} {
		steps = append(steps, []string{"ip", "-n", ns, "link", "set", "eth0", "up"})
	}
	steps = append(steps,
		[]string{"ip", "-n", t.node, "link", "set", "to-client", "up"},
		[]string{"ip", "-n", t.node, "link", "set", "to-backend", "up"},
		[]string{"ip", "-n", t.client, "route", "add", benchwork.ServiceCIDR, "via", "198.51.100.1"},
		[]string{"ip", "-n", t.client, "route", "add", benchwork.ClusterCIDR, "via", "198.51.100.1"},
		[]string{"ip", "-n", t.backend, "route", "add", "default", "via", benchwork.NodeIP},
		[]string{"ip", "-n", t.node, "route", "add", benchwork.ClusterCIDR, "via", "192.0.2.2"},
		[]string{"ip", "netns", "exec", t.node, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	)
	for _, a := range eps {
		steps = append(steps, []string{"ip", "-n", t.backend, "addr", "add", a.String() + "/32", "dev", "eth0"})
	}
	for _, s := range steps {
		if err := sh(s...); err != nil {
			return err
		}
	}
	return nil
}

// serve starts the backend's TCP server on port 8080 of every address.
func (t *topo) serve(driver string, log io.Writer) error {
	cmd := exec.Command("ip", "netns", "exec", t.backend, driver, "serve", "-addr", ":8080")
	cmd.Stderr = log
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	t.server = cmd
	if l, _ := bufio.NewReader(out).ReadString('\n'); l != "listening\n" {
		return fmt.Errorf("backend server did not start")
	}
	return nil
}

func (t *topo) close() {
	if t.server != nil {
		_ = t.server.Process.Signal(syscall.SIGTERM)
		_ = t.server.Wait()
	}
	for _, ns := range []string{t.node, t.client, t.backend} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}
