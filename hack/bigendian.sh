#!/bin/sh
# Runs the unit tests of the packages that encode and decode netlink
# messages under a big-endian byte order: cross-built for linux/s390x and
# run under qemu's user-mode emulation (qemu-s390x, called directly: no
# binfmt handler is registered). A netlink header is in the host's byte
# order, so a header written in a fixed order passes on this machine and
# fails here. Tests that need the host's kernel (a netlink socket of
# their own) are skipped by name with -skip.
#
#   hack/bigendian.sh [-skip REGEXP] PACKAGE...
set -eu
GO=${GO:-go}
skip=
if [ "${1:-}" = -skip ]; then
	skip=$2
	shift 2
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
root=$(pwd)
for p in "$@"; do
	bin="$dir/$(echo "$p" | tr -c 'a-zA-Z0-9\n' _).test"
	CGO_ENABLED=0 GOOS=linux GOARCH=s390x $GO test -c -o "$bin" "$p"
	if [ ! -f "$bin" ]; then
		echo "bigendian: $p has no tests" >&2
		exit 1
	fi
	(cd "$root/$p" && qemu-s390x "$bin" -test.count=1 ${skip:+-test.skip "$skip"}) >"$dir/out" 2>&1 || {
		cat "$dir/out"
		echo "bigendian: $p fails under linux/s390x" >&2
		exit 1
	}
	echo "ok  	$p (linux/s390x under qemu-s390x)"
done
