#!/bin/sh
# Installs what the real-cluster tests take from Debian, when missing: the
# nodes' runtime (containerd, runc, the CNI plugins), etcd, the tools the
# harness runs (ip, nsenter, unshare), and the programs the test images and
# kube-proxy's image are assembled from (dash, busybox, curl, wget,
# netcat-openbsd, dig and host, nft, iptables). No service of theirs is
# started.
set -eu
exec "$(dirname "$0")/../../hack/apt-install.sh" \
	containerd runc containernetworking-plugins etcd-server \
	iproute2 util-linux \
	dash busybox-static curl wget netcat-openbsd bind9-dnsutils libc-bin \
	nftables iptables
