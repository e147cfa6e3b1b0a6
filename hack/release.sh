#!/bin/sh
# make release VERSION=vX.Y.Z: the release's artifacts in dist/VERSION
# (OUT overrides), built from the commit checked out, which must be clean:
#   kproxy-VERSION-linux-amd64, kproxy-VERSION-linux-arm64
#                            static binaries (CGO_ENABLED=0), version-stamped
#   kproxy-VERSION-oci.tar   an OCI image layout (tar) whose index, named
#                            kproxy:VERSION, holds an image per architecture
#   kproxy-VERSION.spdx.json the SBOM (SPDX 2.3) from the binaries' own
#                            module information
#   RELEASE-NOTES.md         the CHANGELOG's section of VERSION
#   SHA256SUMS               of all of the above
# Every file depends only on the commit and the Go toolchain: two releases
# of one commit are byte-identical (hack/release_test.go checks it). The
# time they carry is the commit's.
set -eu
GO=${GO:-go}
VERSION=${VERSION:-}
case "$VERSION" in
v[0-9]*.[0-9]*.[0-9]*) ;;
*) echo "release: VERSION=$VERSION: want a version such as v0.1.0" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ -z "${RELEASE_DIRTY:-}" ] && [ -n "$(git status --porcelain)" ]; then
	echo "release: the tree has uncommitted changes; commit them first" >&2
	exit 1
fi
out=${OUT:-$root/dist/$VERSION}
commit=$(git rev-parse HEAD)
epoch=$(git log -1 --format=%ct HEAD)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$out"
mkdir -p "$out"

# The notes: the CHANGELOG's section of the version, which must exist.
awk -v v="$VERSION" '
	/^## / { if (on) exit; on = ($2 == v || index($2, "[" v "]") == 1) }
	on { print }
' CHANGELOG.md >"$out/RELEASE-NOTES.md"
if [ ! -s "$out/RELEASE-NOTES.md" ]; then
	echo "release: CHANGELOG.md has no section \"## $VERSION\"" >&2
	exit 1
fi

for arch in amd64 arm64; do
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch $GO build -trimpath -buildvcs=false \
		-ldflags "-s -w -buildid= -X main.version=$VERSION -X main.commit=$commit" \
		-o "$out/kproxy-$VERSION-linux-$arch" ./examples/cmd/kproxy
done

$GO run ./examples/hack/image --out "$tmp/oci" --tag "kproxy:$VERSION" --version "$VERSION" --revision "$commit" \
	--platform "linux/amd64=$out/kproxy-$VERSION-linux-amd64" --platform "linux/arm64=$out/kproxy-$VERSION-linux-arm64" >/dev/null
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --mode=u+rw,go+r,go-w --format=posix \
	--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
	-C "$tmp/oci" -cf "$out/kproxy-$VERSION-oci.tar" .

$GO run ./hack/sbom -version "$VERSION" -created "$epoch" \
	"$out/kproxy-$VERSION-linux-amd64" "$out/kproxy-$VERSION-linux-arm64" >"$out/kproxy-$VERSION.spdx.json"

(cd "$out" && sha256sum -- kproxy-* RELEASE-NOTES.md | LC_ALL=C sort -k2 >SHA256SUMS)
echo "release $VERSION ($commit) in $out:"
cat "$out/SHA256SUMS"
