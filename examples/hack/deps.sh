#!/bin/sh
# Installs what the examples' tests need from Debian when it is missing:
# etcd (package etcd-server), which kube-apiserver stores its state in. The
# package's own service is not started. kube-apiserver and Consul are built
# from the Go module proxy by examples/internal/testservers.
set -eu
command -v etcd >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "examples deps: etcd missing (run as root, or apt-get install etcd-server)" >&2
	exit 1
fi
echo "examples deps: installing etcd-server"
export DEBIAN_FRONTEND=noninteractive
# Keep the package's service from starting: the tests run their own etcd.
policy=/usr/sbin/policy-rc.d
created=""
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod +x "$policy"
	created=1
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
[ -n "$created" ] && rm -f "$policy"
exit 0
