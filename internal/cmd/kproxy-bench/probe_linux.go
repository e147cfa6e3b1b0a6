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

	"github.com/kproxy-dev/kproxy/internal/benchwork"
)

// probe measures TCP connects to the targets (benchwork.Connect) and
// prints their percentiles.
func probe(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	targets := fs.String("targets", "", "comma-separated addr:port list")
	n := fs.Int("n", 1000, "connections")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lat, err := benchwork.Connect(strings.Split(*targets, ","), *n, 2*time.Second)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(lat)
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
