module github.com/kproxy-dev/kproxy/examples

go 1.26.0

require (
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
)

require golang.org/x/sys v0.49.0 // indirect

replace github.com/kproxy-dev/kproxy => ../
