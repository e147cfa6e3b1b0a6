//go:build privileged

package testservers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
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

// A dead process's directory is removed; a live one's stays.
func TestTempDirReaps(t *testing.T) {
	dead := filepath.Join(os.TempDir(), fmt.Sprintf("kproxy-test-%d-x", 1<<22+12345))
	live := filepath.Join(os.TempDir(), fmt.Sprintf("kproxy-test-%d-x", os.Getpid()))
	for _, d := range []string{dead, live} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.RemoveAll(dead); os.RemoveAll(live) })
	d, err := tempDir("test")
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(d)
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("%s not reaped", dead)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("%s of a live process removed", live)
	}
}
