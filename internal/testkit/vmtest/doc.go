//go:build linux

// Package vmtest runs the module's vm-tagged tests inside a qemu guest that
// boots Debian's cloud kernel, which has what the development machines'
// kernel lacks (IPVS, dummy links, SCTP). `make test-vm` drives it through
// cmd/vmrun; docs/vm-tests.md is the user's guide.
//
// # Model
//
// A run has five steps, each a small piece of this package:
//
//  1. FindPackages lists the packages (go list) and keeps those with test
//     files whose //go:build constraint needs the vm tag (NeedsVM) and
//     that declare a test, fuzz test or example. The tests declared in
//     its other test files (ordinary tests, built without the vm tag too)
//     are its HostTests: the guest skips them unless the run selects
//     tests itself, since the host runs them and they need no kernel.
//  2. KernelCache.Ensure resolves the versioned package that
//     linux-image-cloud-amd64 depends on (apt-cache), downloads it
//     (apt-get download), unpacks it (dpkg -x) and indexes its modules
//     (depmod -b), once per package version, under <cache>/kernel.
//  3. The test binaries are compiled with CGO_ENABLED=0 go test -c -tags vm.
//  4. The initramfs is three cpio archives concatenated, as the kernel
//     allows: the tools (busybox, kmod, setpriv, ip, nft, ipset, ipvsadm,
//     conntrack, iptables-nft with its extensions, their libraries found
//     with ldd, and the data files they read), the kernel modules (netfilter, ipset, IPVS,
//     SCTP, bridge, dummy, veth and what they depend on), and the tests
//     (binaries, their testdata, and /init). The first two are cached under
//     <cache>/initramfs by a key of their content (Listing.Key) and rebuilt
//     only when it changes; the third is rewritten on every run. None is
//     compressed: unpacking plain cpio is faster under emulation than
//     decompressing.
//  5. VM.Run boots qemu (TCG: KVM fails with emulation errors on the
//     machines this runs on) with two watchdogs: one for a guest that has
//     written nothing for Config.Idle (10 minutes: a hang), and one for the
//     whole run, Config.Timeout (an hour), so that a guest slowed down by
//     a busy machine, which keeps writing test output, finishes instead of
//     being cut at a fixed time that an idle machine needs half of. The guest's /init
//     (InitConfig.Script) mounts proc, sys, devtmpfs and tmpfs on /run and
//     /tmp, loads DefaultModules, exports CI, runs each binary in its
//     package directory with the given flags and powers off. The console
//     (ttyS0) streams to the runner's output; /init copies the tests' output
//     and its marker lines (see Marker) to a second serial port (ttyS1)
//     that qemu writes to a file, and ParseResults reads that file, so that
//     kernel messages never garble a result line.
//
// A run fails (Report.Err) when a binary exits non-zero, a test fails or is
// skipped (in the guest a skip means a missing kernel feature), a module
// does not load, a binary runs no test while no -run or -skip filter was
// given, or a binary's exit line or the final done line is missing (crash,
// kernel panic, watchdog).
//
// # What it touches
//
// Only the cache directory (default .cache/vm in the module) and the
// packages' build output. The guest is a throwaway machine: nothing of the
// host's network or firewall is touched, and no root is needed on the host
// except to let apt-get update its package lists when they lack the
// kernel package. The qemu process it starts is killed by its pid when the
// watchdog fires or the context ends.
package vmtest
