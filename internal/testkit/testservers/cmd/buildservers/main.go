//go:build linux

// Command buildservers builds the servers the examples' tests run
// (kube-apiserver and Consul, from the Go module proxy) into the cache, so
// that the tests themselves never wait for a build, and checks that etcd is
// installed. It prints each binary's path.
//
//	go run ./internal/testkit/testservers/cmd/buildservers
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/testservers"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "buildservers:", err)
		os.Exit(1)
	}
}

// run builds the servers side by side: each build has serial stretches
// (module downloads, the link) that the other's compiling fills.
func run(ctx context.Context) error {
	servers := []testservers.Server{testservers.KubeAPIServer, testservers.Consul}
	lines := make([]string, len(servers))
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() {
			start := time.Now()
			bin, err := s.Binary(ctx)
			if err != nil {
				errs[i] = err
				return
			}
			lines[i] = fmt.Sprintf("%s %s: %s (%s)", s.Name, s.Version, bin, time.Since(start).Round(time.Millisecond))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	etcd, err := testservers.EtcdBinary()
	if err != nil {
		return err
	}
	fmt.Printf("etcd: %s\n", etcd)
	return nil
}
