//go:build privileged

package main

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/internal/testkit/testservers"
)

// The servers the tests share, started by the first test that needs one
// and stopped after the last test.
var servers struct {
	kubeOnce sync.Once
	kube     *testservers.Kube
	kubeErr  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	servers.kube.Stop()
	os.Exit(code)
}

// apiServer returns the shared kube-apiserver, starting it first.
func apiServer(t *testing.T) *testservers.Kube {
	t.Helper()
	servers.kubeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		servers.kube, servers.kubeErr = testservers.StartKube(ctx)
	})
	if servers.kubeErr != nil {
		testutil.SkipOrFail(t, "kube-apiserver: "+servers.kubeErr.Error())
	}
	return servers.kube
}
