//go:build privileged && !vm

package main

// vmBackends is empty on the host, whose kernel may have no IPVS (this
// machine's has none): the VM runs these tests with ipvs too
// (make test-examples runs them there).
var vmBackends []string

// capsBackends are the backends TestCapabilities runs on the host; the
// VM runs ipvs.
var capsBackends = []string{"nftables", "iptables", "ebpf", "userspace"}
