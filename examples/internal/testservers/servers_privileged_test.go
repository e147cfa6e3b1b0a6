//go:build privileged

package testservers

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func gone(t *testing.T, p *proc) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.Signal(0)); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("%s (pid %d) still running after Stop: %v", p.name, p.cmd.Process.Pid, err)
	}
}

func TestKubeStartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	k, err := StartKube(ctx)
	if err != nil {
		t.Fatal(err)
	}
	etcd, api, dir := k.etcd, k.api, k.dir
	k.Stop()
	gone(t, etcd)
	gone(t, api)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left behind", dir)
	}
	if c, err := net.DialTimeout("tcp", k.URL[len("https://"):], time.Second); err == nil {
		c.Close()
		t.Error("kube-apiserver still listening after Stop")
	}
}

func TestConsulStartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := StartConsul(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := c.p
	c.Stop()
	gone(t, p)
	if conn, err := net.DialTimeout("tcp", c.Addr, time.Second); err == nil {
		conn.Close()
		t.Error("consul still listening after Stop")
	}
}
