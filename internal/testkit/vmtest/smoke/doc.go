//go:build linux

// Package smoke holds the vm-tagged test that proves the test guest booted
// by `make test-vm` has every kernel feature and tool the dataplanes need:
// dummy and veth links, IPVS with its schedulers, ipset, nf_tables with the
// nft and iptables-nft tools, conntrack and SCTP sockets. It has no code of
// its own; see kernel_vm_test.go.
package smoke
