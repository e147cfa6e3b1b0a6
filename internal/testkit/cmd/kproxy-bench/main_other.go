//go:build !linux

// Command kproxy-bench drives kproxy's backends for the comparison with
// kube-proxy; it runs on Linux only.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "kproxy-bench: Linux only")
	os.Exit(1)
}
