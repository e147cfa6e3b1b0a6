#!/bin/sh
# A consumer's view of the module graph: a module that imports only
# servicelb and nftables must not pull lint tools, Kubernetes or
# HashiCorp modules into its build (`go list -m all`). Runs against this
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
