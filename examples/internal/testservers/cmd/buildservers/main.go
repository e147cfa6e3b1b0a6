// Command buildservers builds the servers the examples' tests run
// (kube-apiserver and Consul, from the Go module proxy) into the cache, so
// that the tests themselves never wait for a build, and checks that etcd is
// installed. It prints each binary's path.
//
//	go run ./examples/internal/testservers/cmd/buildservers
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/kproxy-dev/kproxy/examples/internal/testservers"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "buildservers:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	for _, s := range []testservers.Server{testservers.KubeAPIServer, testservers.Consul} {
		start := time.Now()
		bin, err := s.Binary(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("%s %s: %s (%s)\n", s.Name, s.Version, bin, time.Since(start).Round(time.Millisecond))
	}
	etcd, err := testservers.EtcdBinary()
	if err != nil {
		return err
	}
	fmt.Printf("etcd: %s\n", etcd)
	return nil
}
