module github.com/kproxy-dev/kproxy

go 1.26.0

require (
	// Pure Go: loads the ebpf package's programs with no C compiler.
	github.com/cilium/ebpf v0.22.0
	github.com/google/go-cmp v0.7.0
	github.com/google/nftables v0.3.0
	// Current tagged releases: the netlink transport of conntrack and ipset.
	github.com/mdlayher/netlink v1.11.2
	github.com/mdlayher/socket v0.8.0
	github.com/stretchr/testify v1.12.1
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.50.0
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.24.0 // indirect
)
