//go:build linux

package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"
)

// probe measures TCP connects to the targets (benchwork.Connect) and
// prints their percentiles; with -direct, connects to those too, in turn
// with the targets' (benchwork.ConnectBoth), and prints both, as
// {"connect": ..., "direct": ...}.
func probe(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	targets := fs.String("targets", "", "comma-separated addr:port list")
	direct := fs.String("direct", "", "comma-separated addr:port list of the same path without the service")
	n := fs.Int("n", 1000, "connections (to each list)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	if *direct == "" {
		lat, err := benchwork.Connect(strings.Split(*targets, ","), *n, 2*time.Second)
		if err != nil {
			return err
		}
		return out.Encode(lat)
	}
	through, routed, err := benchwork.ConnectBoth(strings.Split(*targets, ","), strings.Split(*direct, ","), *n, 2*time.Second)
	if err != nil {
		return err
	}
	return out.Encode(map[string]benchwork.Latency{"connect": through, "direct": routed})
}

// serve accepts TCP connections on addr and closes them, until signalled.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", ":8080", "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Println("listening")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return ln.Close()
}
