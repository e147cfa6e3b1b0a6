#!/bin/sh
# Consumers' views of the module, each a module of its own outside this
# one, through a replace directive to this checkout:
#  - a module that imports only servicelb and nftables must not pull lint
#    tools, Kubernetes or HashiCorp modules into its build (`go list -m all`);
#  - one that imports ebpf gets staticcheck's module (honnef.co/go/tools)
#    only as cilium/ebpf's go.mod requires it (its tool directives; see the
#    README's note on dependencies), and nothing of the kind from kproxy;
#  - a module that feeds kproxy from Kubernetes (the kube module, its own
#    go.mod) builds outside, with no lint tools or HashiCorp modules;
#  - a third-party backend's conformance test (conformance.Run, with
#    conformance.Main as its TestMain, for a backend with socket hooks)
#    must build: it is vetted and compiled (go test -c), not run.
set -eu
GO=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# module NAME DIR: a go.mod for a consumer module in DIR.
module() {
	mkdir -p "$2"
	cat >"$2/go.mod" <<MOD
module $1

go 1.26.0

require github.com/kproxy-dev/kproxy v0.0.0

replace github.com/kproxy-dev/kproxy => $root
MOD
}

# graph DIR WHAT PATTERN: tidies and builds the consumer module in DIR,
# fails naming the modules of its graph that match PATTERN, and prints
# the graph's size.
graph() {
	cd "$1"
	GOWORK=off GOFLAGS=-mod=mod $GO mod tidy >/dev/null
	GOWORK=off $GO build ./...
	mods=$(GOWORK=off $GO list -m all)
	bad=$(echo "$mods" | grep -E "$3" || true)
	if [ -n "$bad" ]; then
		echo "a consumer of $2 lists:" >&2
		echo "$bad" >&2
		exit 1
	fi
	count=$(echo "$mods" | wc -l)
}

module example.com/consumer "$dir/consumer"
cat >"$dir/consumer/main.go" <<'SRC'
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
(
	graph "$dir/consumer" "servicelb and nftables" 'honnef.co|golangci|staticcheck|golang.org/x/vuln|k8s.io|sigs.k8s.io|hashicorp'
	echo "consumer module graph: $count modules, no tools, k8s.io or hashicorp"
)

module example.com/ebpfconsumer "$dir/ebpf"
cat >"$dir/ebpf/main.go" <<'SRC'
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
(
	cd "$dir/ebpf"
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
)

module example.com/backend "$dir/backend"
cat >"$dir/backend/backend.go" <<'SRC'
// Package backend stands for a third party's dataplane: a Proxier of its
// own, here one that hands everything to nftables.
package backend

import "github.com/kproxy-dev/kproxy/nftables"

// Proxier is the backend under test.
type Proxier struct{ *nftables.Proxier }
SRC
cat >"$dir/backend/conformance_test.go" <<'SRC'
//go:build linux

package backend_test

import (
	"testing"

	"github.com/vishvananda/netns"

	"example.com/backend"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/conformance"
)

func TestMain(m *testing.M) { conformance.Main(m) }

func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Backend{
		Name:   "backend",
		Cgroup: "/sys/fs/cgroup/backend-test",
		New: func(t testing.TB, ns netns.NsHandle) servicelb.Proxier {
			p, err := nftables.New(nftables.Options{NetNS: ns})
			if err != nil {
				t.Fatal(err)
			}
			return backend.Proxier{Proxier: p}
		},
	}, conformance.Options{NotApplicable: []string{"node-port/localhost", "scheduler/maglev-spreads-one-clients-connections"}})
}
SRC
(
	cd "$dir/backend"
	GOWORK=off GOFLAGS=-mod=mod $GO mod tidy >/dev/null
	GOWORK=off $GO vet ./...
	GOWORK=off $GO test -c -o "$dir/backend.test" .
	echo "a third-party backend's conformance test builds outside the module"
)

module example.com/kubeconsumer "$dir/kube"
cat >>"$dir/kube/go.mod" <<MOD
require github.com/kproxy-dev/kproxy/kube v0.0.0

replace github.com/kproxy-dev/kproxy/kube => $root/kube
MOD
cat >"$dir/kube/main.go" <<'SRC'
package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kproxy-dev/kproxy/kube"
	"github.com/kproxy-dev/kproxy/kube/kubeproxyconfig"
	"github.com/kproxy-dev/kproxy/kube/metrics"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func main() {
	t, err := kube.Translate(nil, nil)
	c := &kubeproxyconfig.Config{}
	kubeproxyconfig.Default(c)
	m := metrics.NewKubeProxy(prometheus.NewRegistry(), func() servicelb.Health { return servicelb.Health{} })
	fmt.Println(t, err, kubeproxyconfig.Validate(c), m)
}
SRC
(
	graph "$dir/kube" kube 'honnef.co|golangci|staticcheck|golang.org/x/vuln|hashicorp'
	echo "kube consumer module graph: $count modules, no tools or hashicorp"
)
