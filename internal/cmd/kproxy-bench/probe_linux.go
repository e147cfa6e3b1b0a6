//go:build linux

package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// probe opens n TCP connections, round robin over the targets, each a new
// flow, and prints the connect times' percentiles (a connect returns with
// the SYN-ACK: one round trip through the node's rules for a new flow).
func probe(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	targets := fs.String("targets", "", "comma-separated addr:port list")
	n := fs.Int("n", 1000, "connections")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addrs := strings.Split(*targets, ",")
	var lat []float64
	failed := 0
	for i := range *n {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp", addrs[i%len(addrs)], 2*time.Second)
		el := time.Since(t0)
		if err != nil {
			failed++
			continue
		}
		lat = append(lat, float64(el.Nanoseconds())/1e3)
		// An abortive close (RST) leaves no TIME_WAIT behind, so the
		// client's ports do not run out over a long probe.
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	if len(lat) == 0 {
		return fmt.Errorf("no connection succeeded (%d failed)", failed)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"p50_us": pct(0.50), "p99_us": pct(0.99), "n": len(lat), "failed": failed,
	})
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
