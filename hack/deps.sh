#!/bin/sh
# Installs the Debian packages the tests use as oracles and tools, when
# missing. Runs apt-get update once, only if something must be installed.
set -eu
need=""
check() { command -v "$1" >/dev/null 2>&1 || need="$need $2"; }
check nft nftables
check iptables-nft-save iptables
check ipset ipset
check conntrack conntrack
check ipvsadm ipvsadm
check ip iproute2
check qemu-system-x86_64 qemu-system-x86
check depmod kmod
check cpio cpio
check systemd-analyze systemd
check setpriv util-linux
check strace strace
check python3 python3
[ -x /bin/busybox ] || need="$need busybox-static"
# The CA bundle make image packs.
[ -f /etc/ssl/certs/ca-certificates.crt ] || need="$need ca-certificates"
[ -z "$need" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "deps: missing packages:$need (run as root to install them)" >&2
	exit 1
fi
echo "deps: installing$need"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $need >/dev/null
