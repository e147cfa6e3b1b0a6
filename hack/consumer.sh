#!/bin/sh
# A consumer's view of the module graph: a module that imports only
# servicelb and nftables must not pull lint tools, Kubernetes or
# HashiCorp modules into its build (`go list -m all`); one that imports
# ebpf gets staticcheck's module (honnef.co/go/tools) only as cilium/ebpf's
# go.mod requires it (its tool directives; see the README's note on
# dependencies), and nothing of the kind from kproxy. Runs against this
# checkout through a replace directive.
set -eu
GO=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/go.mod" <<MOD
module example.com/consumer

go 1.26.0

require github.com/kproxy-dev/kproxy v0.0.0

replace github.com/kproxy-dev/kproxy => $root
MOD
cat >"$dir/main.go" <<'SRC'
package main

import (
	"fmt"

	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func main() {
	out, err := nftables.Render(&servicelb.State{}, nftables.Options{})
	fmt.Println(out, err)
}
SRC
cd "$dir"
GOWORK=off GOFLAGS=-mod=mod $GO mod tidy >/dev/null
GOWORK=off $GO build ./...
mods=$(GOWORK=off $GO list -m all)
bad=$(echo "$mods" | grep -E 'honnef.co|golangci|staticcheck|golang.org/x/vuln|k8s.io|sigs.k8s.io|hashicorp' || true)
if [ -n "$bad" ]; then
	echo "a consumer of servicelb and nftables lists:" >&2
	echo "$bad" >&2
	exit 1
fi
echo "consumer module graph: $(echo "$mods" | wc -l) modules, no tools, k8s.io or hashicorp"

cat >"$dir/main.go" <<'SRC'
package main

import (
	"fmt"

	"github.com/kproxy-dev/kproxy/ebpf"
)

func main() {
	p, err := ebpf.ForRendering(ebpf.Options{Cgroup: "/sys/fs/cgroup"})
	fmt.Println(p, err)
}
SRC
GOWORK=off GOFLAGS=-mod=mod $GO mod tidy >/dev/null
GOWORK=off $GO build ./...
mods=$(GOWORK=off $GO list -m all)
bad=$(echo "$mods" | grep -E 'golangci|golang.org/x/vuln|k8s.io|sigs.k8s.io|hashicorp' || true)
tools=$(GOWORK=off $GO mod graph | grep -E ' honnef.co/' | grep -v '^github.com/cilium/ebpf@' || true)
if [ -n "$bad$tools" ]; then
	echo "a consumer of ebpf lists:" >&2
	echo "$bad" >&2
	echo "$tools" >&2
	exit 1
fi
echo "ebpf consumer module graph: $(echo "$mods" | wc -l) modules; honnef.co/go/tools only through cilium/ebpf's go.mod"
