#!/bin/sh
# Installs the Debian packages the tests use as oracles and tools, when
# missing (hack/apt-install.sh: apt-get update at most once).
set -eu
exec "$(dirname "$0")/apt-install.sh" \
	nftables iptables ipset conntrack ipvsadm iproute2 \
	qemu-system-x86 qemu-user kmod cpio systemd util-linux strace python3 \
	busybox-static ca-certificates
