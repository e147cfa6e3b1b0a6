// The real-cluster tests: a Kubernetes cluster built from source in
// network, mount and UTS namespaces of its own, with kproxy deployed in
// kube-proxy's place, and Kubernetes' own end-to-end tests run against it
// and against kube-proxy (make test-e2e). A module of its own, outside the
// workspace, so that nothing of it enters the core's module graph: build
// it with GOWORK=off.
module github.com/kproxy-dev/kproxy/e2e

go 1.26.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/kproxy-dev/kproxy v0.0.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/sys v0.50.0
)

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/google/nftables v0.3.0 // indirect
	github.com/mdlayher/netlink v1.11.2 // indirect
	github.com/mdlayher/socket v0.8.0 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
)

replace github.com/kproxy-dev/kproxy => ../
