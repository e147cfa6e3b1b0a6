# kproxy: one command runs every test: `make test`.
#
#   make help         this text (the default target)
#   make test         deps, lint, vulncheck, unit, network namespace and VM tests, examples
#   make test-unit    unprivileged tests (no root needed)
#   make test-netns   privileged tests in throwaway network namespaces (root)
#   make test-vm      tests that need IPVS or dummy links, in a qemu VM (root)
#   make test-examples  the examples and the kproxy binary against real servers
#   make kproxy       build the kproxy binary into ./bin (static)
#   make image        pack ./bin/kproxy into an OCI image layout, ./bin/kproxy-image
#   make release VERSION=v0.1.0  the release's binaries (linux/amd64, arm64),
#                     image index, SBOM, notes and SHA256SUMS in dist/VERSION
#   make bench        benchmarks (root); bench-ebpf, bench-nftables, ... one backend's
#   make vulncheck    govulncheck of both modules, standard library included
#   make api          write api/next.txt, the exported API, from the code (lint checks it)
#   make test-e2e     Kubernetes' own e2e tests of services in a real cluster, kproxy
#                     beside kube-proxy (root; not in test; make test runs its smoke)
#   make bench-compare  kproxy against kube-proxy's own proxiers (root; not in test);
#                     bench-report writes its report again with bench-ipvs's results
#   make fuzz         every fuzz target for FUZZTIME each (default 30s)
#   make soak         chaos soak of each backend, SOAK_DURATION each (root; not in test)
#
# Under CI=true a privileged test that cannot run fails instead of skipping.
#
# Every target builds with GOTOOLCHAIN, a Go the module proxy serves: a
# machine with an older Go fetches it once.

export GOTOOLCHAIN ?= go1.27.3
GO       ?= go
FUZZTIME ?= 30s
GOFLAGS  ?=
CI       ?=
export CI

# Packages of the core module, of the Kubernetes layer's module and of
# the examples module.
CORE     := ./...
KUBE     := ./kube/...
EXAMPLES := ./examples/...
TAGS_ALL := privileged,vm
# Lint also sees the soak (internal/testkit/soak), whose run builds only with
# its tag.
TAGS_LINT := $(TAGS_ALL),soak

# What --version prints, set at link time.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)

.DEFAULT_GOAL := help

# help prints the comment this file opens with.
help:
	@awk '/^#/ { sub(/^# ?/, ""); print; next } { exit }' $(firstword $(MAKEFILE_LIST))

.PHONY: help test deps lint api test-unit test-bigendian test-netns test-vm test-examples servers bench fuzz soak vulncheck kproxy image

test: deps lint vulncheck test-unit test-bigendian test-netns test-vm test-examples test-bench-smoke test-e2e-smoke

deps:
	@hack/deps.sh

# The lint tools live in their own module (tools/go.mod), so that they
# never enter the module graph of anyone who depends on kproxy. staticcheck
# is built from it once and runs in the workspace, which joins the core,
# kube and examples modules (they require each other at the version they
# are released at, which only the workspace provides before the tag).
STATICCHECK := $(CURDIR)/.cache/bin/staticcheck
$(STATICCHECK): tools/go.mod tools/go.sum
	cd tools && GOWORK=off $(GO) build -o $@ honnef.co/go/tools/cmd/staticcheck
# Lint also checks that the core builds everywhere (ErrNotSupported at run
# time off Linux), so that an agent's other parts build on any machine.
lint: $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags $(TAGS_LINT) $(CORE) $(KUBE) $(EXAMPLES)
	$(GO) test -count=1 ./internal/archtest
	$(STATICCHECK) -tags $(TAGS_LINT) $(CORE)
	cd kube && $(STATICCHECK) -tags $(TAGS_ALL) ./...
	cd examples && $(STATICCHECK) -tags $(TAGS_ALL) ./...
	GO=$(GO) hack/consumer.sh
	GOOS=darwin $(GO) build $(CORE)
	GOOS=windows $(GO) vet $(CORE)
	cd e2e && GOWORK=off $(GO) vet ./... && GOWORK=off $(STATICCHECK) ./...
	cd tools && GOWORK=off $(GO) vet ./... && GOWORK=off $(GO) test -count=1 ./...
	$(APICHECK) $(API_MODULES)

# The exported API of the modules against api/ (see tools/apicheck): make
# api writes api/next.txt from the code, for review with the change.
APICHECK    := cd tools && GOWORK=off $(GO) run ./apicheck -api $(CURDIR)/api
API_MODULES := $(CURDIR) $(CURDIR)/kube $(CURDIR)/examples
api:
	$(APICHECK) -write $(API_MODULES)

test-unit:
	$(GO) test -count=1 $(CORE) $(KUBE) $(EXAMPLES)
	cd e2e && GOWORK=off $(GO) test -count=1 ./...

# The netlink encoders and decoders under a big-endian byte order: their
# unit tests cross-built for linux/s390x and run under qemu-s390x (see
# hack/bigendian.sh). conntrack's test of a socket in the caller's
# namespace needs the host's kernel.
BIGENDIAN_PKGS := ./internal/nfnl ./internal/nl ./internal/xtables ./internal/rtnl ./internal/ipvsnl ./ipset ./conntrack
test-bigendian: deps
	GO=$(GO) hack/bigendian.sh -skip '^TestNewInTheCallersNamespace$$' $(BIGENDIAN_PKGS)

test-netns: deps servers
	$(GO) test -count=1 -tags privileged $(CORE)

# VMTEST_FLAGS go to every vm test binary (e.g. -run 'TestX|TestY' -count 2),
# VMTEST_PKGS limits the packages searched for vm tests, VMTEST_ARGS adds
# runner flags (e.g. -shell for a shell in the guest). The first two reach the
# runner through the environment, unparsed by the shell. See docs/vm-tests.md.
# -short: the property tests take fewer random steps under emulation; the
# host runs them in full.
VMTEST_FLAGS ?= -short
VMTEST_PKGS  ?= ./...
VMTEST_ARGS  ?=
export VMTEST_FLAGS VMTEST_PKGS
test-vm: deps
	$(GO) run ./internal/testkit/vmtest/cmd/vmrun $(VMTEST_ARGS)

# kproxy, the node proxy of examples/cmd/kproxy: a static binary (no cgo),
# so that it runs in an image without a C library.
kproxy:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/kproxy ./examples/cmd/kproxy

# The image of bin/kproxy as an OCI image layout, built without a container
# runtime, with the CA bundle of Debian's ca-certificates; push it with
# crane or skopeo (see examples/hack/image).
image: kproxy
	$(GO) run ./examples/hack/image --binary bin/kproxy --out bin/kproxy-image --tag kproxy:$(VERSION) --version $(VERSION) --revision $(COMMIT)

# A release of the commit checked out (see hack/release.sh); two releases
# of one commit are byte-identical (hack/release_test.go checks it).
release:
	GO=$(GO) VERSION=$(VERSION) hack/release.sh

# The real servers the tests talk to (internal/testkit/testservers): etcd
# from Debian, kube-apiserver and Consul built once into the user cache. A
# build here is outside any test's time limit, so that a cold machine, or
# a busy one, takes as long as it needs (a cold build of kube-apiserver
# takes minutes) and the tests then only start the servers.
SERVER_MODULES := $(CURDIR)/internal/testkit/testservers/modules
servers: deps
	@examples/hack/deps.sh
	KPROXY_SERVER_MODULES=$(SERVER_MODULES) $(GO) run ./internal/testkit/testservers/cmd/buildservers

# The examples' tests run the agents and the kproxy binary against a real
# kube-apiserver with etcd and a real Consul agent (see servers; the
# deploy manifests are applied to that API server, the systemd unit is
# verified, the image is built and run); the demo's, the file source's and
# kproxy's packet and cleanup tests run again in the VM (IPVS); then the
# demo runs as a smoke test.
test-examples: deps kproxy servers
	KPROXY_SERVER_MODULES=$(SERVER_MODULES) $(GO) test -count=1 -tags privileged -timeout 20m $(EXAMPLES)
	VMTEST_PKGS='./examples/demo ./examples/internal/filesource ./examples/cmd/kproxy' VMTEST_FLAGS= $(GO) run ./internal/testkit/vmtest/cmd/vmrun -q
	$(GO) run ./examples/demo

# govulncheck with the Go vulnerability database built from a pinned
# golang.org/x/vulndb (through the module proxy); fails on a called
# vulnerability of a required module or of GOTOOLCHAIN's standard library.
vulncheck:
	GO=$(GO) hack/vulncheck.sh

fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) hack/fuzz.sh

# The chaos soak (internal/testkit/soak, tag soak), for each backend of
# SOAK_BACKENDS in turn: 2,000 services x 10 endpoints under 100 changes/s
# with traffic flowing, for SOAK_DURATION, while faults are injected at
# random (foreign flushes, deleted chains and elements, a dormant table, a
# foreign writer, a killed and restarted proxier); then the kernel state
# must equal a fresh apply. Each run ends with a report; a failed
# connection outside the faults' windows, other than a session's to an
# endpoint just removed, fails it, and so does the proxier's memory or
# goroutines growing beyond the limits. SOAK_FLAGS adds flags (e.g. -soak.seed=N to
# draw a run's services, changes and faults again).
# See docs/soak.md.
SOAK_BACKENDS ?= nftables iptables
SOAK_DURATION ?= 10m
SOAK_FLAGS    ?=
soak: deps
	status=0; for b in $(SOAK_BACKENDS); do \
		$(GO) test -tags soak -count=1 -timeout 0 -v -run TestSoak ./internal/testkit/soak \
			-args -soak.backend=$$b -soak.duration=$(SOAK_DURATION) $(SOAK_FLAGS) || status=1; \
	done; exit $$status

bench: deps
	$(GO) test -tags privileged -run '^$$' -bench . -benchmem -timeout 60m $(CORE)

# The iptables backend's benchmarks alone: cold load of 10k services x 10
# endpoints against iptables-nft-restore, one-service change against the
# kernel's floor, peak RSS (KPROXY_BENCH_SERVICES=n for another size).
.PHONY: bench-iptables
bench-iptables: deps
	$(GO) test -tags privileged -run '^$$' -bench . -benchmem -timeout 60m ./iptables

# The IPVS backend's benchmarks, in the VM (this host's kernel has no IPVS):
# BenchmarkIPVS, a cold sync of 10k services x 10 endpoints against
# ipvsadm -R of the same virtual servers, the IPVS netlink part alone, a
# restart's sync and a one-endpoint change, reported as ratios of one run
# (IPVS_BENCH_SERVICES=n for another size); BenchmarkIPVSDataPath, the
# first packet (TCP connect p50 and p99) from a client namespace through
# the node to a backend namespace with the comparison's workload of each
# size of IPVS_DATAPATH_SIZES loaded, against a direct connect. Their lines
# go to IPVS_BENCH_OUT, which make bench-compare (and bench-report) fold
# into the comparison's report. `make bench` runs them too.
IPVS_BENCH_SERVICES ?= 10000
IPVS_DATAPATH_SIZES ?= 1000x10,10000x10,50000x5
IPVS_BENCH_OUT      ?= bench/results/ipvs.txt
.PHONY: bench-ipvs
bench-ipvs: deps
	VMTEST_PKGS=./ipvs VMTEST_FLAGS='-run ^$$ -bench ^BenchmarkIPVS -benchtime 1x -ipvs.bench-services $(IPVS_BENCH_SERVICES) -ipvs.datapath-sizes $(IPVS_DATAPATH_SIZES)' \
		$(GO) run ./internal/testkit/vmtest/cmd/vmrun -timeout 120m -mem 4096 -output $(IPVS_BENCH_OUT)
bench: bench-ipvs

# The eBPF backend's benchmarks, each against the nftables backend in the
# same run: a cold sync of 10k services x 10 endpoints (ebpf/nft), one
# endpoint change with 10k services in place (ebpf/nft; large/small against
# 1k), the memory a loaded state keeps (Go heap and kernel; ebpf/nft), and
# the data path from the node's sockets: TCP connect time and a 1 GiB
# stream through a service's address, against a direct connection
# (vip/direct) and the nftables DNAT (nft/direct). `make bench` runs them
# too.
.PHONY: bench-ebpf
bench-ebpf: deps
	$(GO) test -tags privileged -run '^$$' -bench 'ColdSync|SteadyMemory' -benchtime 3x -timeout 30m ./ebpf
	$(GO) test -tags privileged -run '^$$' -bench 'OneEndpointChange' -benchtime 2000x -timeout 30m ./ebpf
	$(GO) test -tags privileged -run '^$$' -bench 'DataPath' -benchtime 1x -timeout 30m ./ebpf
bench: bench-ebpf

# The nftables backend's benchmarks: a cold sync of 10k services x 10
# endpoints and, in the same iterations, `nft -f` of its Render text (their
# ratio is nft/sync); a one-endpoint change with 1k and with 10k services in
# place (large/small is their ratio; large/small-above-floor the ratio of
# their costs above the kernel's floor for an element commit in each
# namespace, which itself grows with the rules loaded); a service added and
# removed at 10k;
# peak RSS. `make bench` runs them too.
.PHONY: bench-nftables
bench-nftables: deps
	$(GO) test -tags privileged -run '^$$' -bench . -benchtime 5x -timeout 30m ./nftables

# kproxy against kube-proxy v1.36.3's own nftables and iptables proxiers
# (the bench module, bench/go.mod, outside the workspace so that Kubernetes
# never enters the core's module graph): for each size of
# BENCH_COMPARE_SIZES (services x endpoints), each proxier in a process and
# network namespace of its own, the cold sync, one-endpoint changes, a
# service added and deleted, a restart over the full table, peak and steady
# RSS and the first packet of new connections; kube-proxy where it finishes
# within BENCH_COMPARE_BOUND. Writes bench/results (compare.md, .svg,
# .json) and the README's performance tables. Not part of `make test`.
BENCH_COMPARE_SIZES ?= 1000x10,10000x10,5000x50,50000x5
BENCH_COMPARE_BOUND ?= 3m
BENCH_COMPARE_FLAGS ?=
BENCH_BIN := $(CURDIR)/.cache/bench
.PHONY: bench-compare bench-compare-build test-bench-smoke
bench-compare-build:
	$(GO) build -o $(BENCH_BIN)/kproxy-bench ./internal/testkit/cmd/kproxy-bench
	cd bench && GOWORK=off $(GO) vet ./... && GOWORK=off $(GO) build -o $(BENCH_BIN)/ ./cmd/...
BENCH_IPVS_FLAG = $(if $(wildcard $(IPVS_BENCH_OUT)),-ipvs $(IPVS_BENCH_OUT))
bench-compare: deps bench-compare-build
	$(BENCH_BIN)/benchcompare -kproxy-driver $(BENCH_BIN)/kproxy-bench -kubeproxy-driver $(BENCH_BIN)/kubeproxy-driver \
		-sizes $(BENCH_COMPARE_SIZES) -bound $(BENCH_COMPARE_BOUND) -out bench/results -readme bench/README.md $(BENCH_IPVS_FLAG) $(BENCH_COMPARE_FLAGS)

# The report of the last bench-compare (bench/results/compare.json) written
# again with the IPVS results of the last bench-ipvs folded in; measures
# nothing.
.PHONY: bench-report
bench-report:
	cd bench && GOWORK=off $(GO) build -o $(BENCH_BIN)/ ./cmd/benchcompare
	$(BENCH_BIN)/benchcompare -from bench/results/compare.json -out bench/results -readme bench/README.md $(BENCH_IPVS_FLAG)

# The bench module's unit tests (its parsing and its report), and the same
# comparison at 100 x 5 with short bounds, as a smoke test.
test-bench-smoke: deps bench-compare-build
	cd bench && GOWORK=off $(GO) test ./...
	$(BENCH_BIN)/benchcompare -kproxy-driver $(BENCH_BIN)/kproxy-bench -kubeproxy-driver $(BENCH_BIN)/kubeproxy-driver \
		-sizes 100x5 -bound 30s -changes 10 -change-budget 2s -services 3 -probes 100 -out $(BENCH_BIN)/smoke > /dev/null
# The userspace backend's benchmarks: on loopback and through network
# namespaces, a 1 KB request and response on a new connection, a 1 GiB
# stream and a 1 KB UDP round trip, each against a direct connection to
# the endpoint in the same run (proxy/direct, medians); the memory of
# 10,000 idle connections through the proxy (as many as the open-file
# limit allows on the host, 10,000 in the VM, where root may raise it;
# through namespaces also the kernel's sockets per connection);
# a cold sync of 1,000 services and a one-endpoint change, listening on
# loopback and holding addresses in a namespace. `make bench` runs them too.
.PHONY: bench-userspace
bench-userspace: deps
	$(GO) test -tags privileged -run '^$$' -bench 'Latency|UDP|SyncEndpoint' -benchtime 3000x ./userspace
	$(GO) test -tags privileged -run '^$$' -bench 'Stream' -benchtime 5x -timeout 30m ./userspace
	$(GO) test -tags privileged -run '^$$' -bench 'SyncCold' -benchtime 20x ./userspace
	$(GO) test -tags privileged -run '^$$' -bench 'IdleConnections' -benchtime 2x -timeout 30m ./userspace
	VMTEST_PKGS=./userspace VMTEST_FLAGS='-run ^$$ -bench IdleConnections -benchtime 1x' \
		$(GO) run ./internal/testkit/vmtest/cmd/vmrun -timeout 30m
bench: bench-userspace

# The real-cluster tests (e2e/, a module of its own; see e2e/README.md): a
# Kubernetes cluster of a control plane and three nodes built from source
# in namespaces of its own, kproxy deployed by deploy/ in kube-proxy's
# place, and Kubernetes' own e2e tests of services run against each of
# kproxy's backends and kube-proxy's modes, each proxy in a cluster of its
# own. test-e2e runs the full selection for E2E_PROXIES and writes
# e2e/results (the report, README.md there, and each proxy's JUnit
# report); it fails on a test kube-proxy passes and kproxy fails, unless
# kproxy's backend declares the limit. test-e2e-smoke (part of make test)
# runs a handful of Services tests against kproxy's nftables backend and
# against kubeadm's kube-proxy DaemonSet with kproxy's image.
# e2e-up starts a cluster with E2E_PROXY and keeps it until interrupted.
E2E_BIN     := $(CURDIR)/.cache/e2e/kproxy-e2e
E2E_PROXIES ?= kube-proxy-nftables,kproxy-nftables,kube-proxy-iptables,kproxy-iptables,kproxy-ebpf,kproxy-userspace,kproxy-kubeadm
E2E_PROXY   ?= kproxy-nftables
E2E_FLAGS   ?=
.PHONY: test-e2e test-e2e-smoke e2e-build e2e-up e2e-reap
e2e-build:
	@e2e/hack/deps.sh
	cd e2e && GOWORK=off $(GO) build -o $(E2E_BIN) ./cmd/kproxy-e2e
test-e2e: image e2e-build
	cd e2e && $(E2E_BIN) run -repo $(CURDIR) -suite full -proxies $(E2E_PROXIES) -results results $(E2E_FLAGS)
test-e2e-smoke: image e2e-build
	cd e2e && $(E2E_BIN) run -repo $(CURDIR) -suite smoke -proxies kproxy-nftables,kproxy-kubeadm -results $(CURDIR)/.cache/e2e-smoke $(E2E_FLAGS)
e2e-up: image e2e-build
	cd e2e && $(E2E_BIN) up -repo $(CURDIR) -proxies $(E2E_PROXY) $(E2E_FLAGS)
e2e-reap: e2e-build
	$(E2E_BIN) reap
