// Command apicheck keeps the exported API of kproxy's modules in text
// files, as Go's own api/ directory does, and fails on a change that
// breaks a released API without saying so.
//
// Each exported feature of a module's public packages (not internal, not
// main) is one line: a constant with its value, a variable, a function or
// method with its signature, a type with its kind, each exported field of
// a struct, and an interface with its method set (so that a method added
// to an interface, which breaks its implementations, changes a line).
//
// In the api directory:
//
//   - next.txt is the API of the next release: its features must be the
//     current API's, exactly (apicheck -write rewrites them), so that every
//     change of the API shows in review. A line "- <feature>" declares a
//     feature of the last release that the next one removes or changes.
//   - v<version>.txt is the API of a release, as next.txt was when it was
//     tagged (without the declarations).
//
// The check fails when the current API differs from next.txt, or when a
// feature of the newest release is gone without a declaration in next.txt.
//
// Usage: apicheck [-write] [-api DIR] MODULE_DIR...
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	write := flag.Bool("write", false, "rewrite the features of next.txt from the current API")
	dir := flag.String("api", "api", "the api directory")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: apicheck [-write] [-api DIR] MODULE_DIR...")
		os.Exit(2)
	}
	features, err := Features(flag.Args()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(1)
	}
	if *write {
		if err := Write(*dir, features); err != nil {
			fmt.Fprintln(os.Stderr, "apicheck:", err)
			os.Exit(1)
		}
		return
	}
	if err := Check(*dir, features); err != nil {
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(1)
	}
}
