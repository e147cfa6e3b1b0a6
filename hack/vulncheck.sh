#!/bin/sh
# govulncheck over the core and the examples with the Go vulnerability
# database built from golang.org/x/vulndb at a pinned version (fetched
# through the Go module proxy like any module, so no other site is
# needed), kept in .cache/vulndb. Fails when the code calls a vulnerable
# function of a required module or of the standard library of the
# toolchain that builds it (the Makefile pins one: GOTOOLCHAIN); lists,
# without failing, the advisories of required modules whose vulnerable
# code the program does not call.
# A scan that fails, or that reports nothing, fails the check too; both
# modules are scanned in any case.
set -eu
GO=${GO:-go}
VULNDB=${VULNDB:-v0.0.0-20261105234957-e22db6528018}
root=$(cd "$(dirname "$0")/.." && pwd)
db=$root/.cache/vulndb/$VULNDB
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -f "$db/index/db.json" ]; then
	src=$(cd "$root/tools" && GOWORK=off GOFLAGS=-mod=mod $GO mod download -json "golang.org/x/vulndb@$VULNDB" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	rm -rf "$db.tmp"
	(cd "$root/tools" && GOWORK=off GOFLAGS=-mod=mod $GO run "golang.org/x/vulndb/cmd/indexdb@$VULNDB" -vulns "$src/data/osv" -out "$db.tmp")
	mv "$db.tmp" "$db"
fi
# govulncheck, built from the tools module, scans in the workspace: the
# modules require each other at the version they are released at, which
# only the workspace provides before the tag.
govulncheck=$root/.cache/bin/govulncheck
(cd "$root/tools" && GOWORK=off $GO build -o "$govulncheck" golang.org/x/vuln/cmd/govulncheck)
scan() { # dir, label; called where set -e does not apply
	out=$tmp/$2.json
	if ! (cd "$1" && "$govulncheck" -db "file://$db" -format json ./... >"$out"); then
		# With -format json, findings do not fail govulncheck: this is
		# an error of the scan itself (a package that does not build,
		# the database unreadable).
		echo "$2: govulncheck failed" >&2
		return 1
	fi
	python3 - "$out" "$2" <<'PY'
import json, sys
dec, text, i = json.JSONDecoder(), open(sys.argv[1]).read(), 0
called, other, config = {}, {}, False
while True:
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    msg, i = dec.raw_decode(text, i)
    config = config or "config" in msg
    f = msg.get("finding")
    if f and f.get("trace"):
        top = f["trace"][0]
        if top.get("function"):
            called[f["osv"]] = top.get("module", "?")
        elif top.get("module", "stdlib") != "stdlib":
            level = "imported" if top.get("package") else "required"
            if other.get(f["osv"], ("", ""))[1] != "imported":
                other[f["osv"]] = (top["module"], level)
if not config:
    print(f"{sys.argv[2]}: govulncheck reported nothing, not even its configuration: no scan to trust", file=sys.stderr)
    sys.exit(1)
std = sorted(k for k, m in called.items() if m == "stdlib")
mods = sorted(f"{k} ({m})" for k, m in called.items() if m != "stdlib")
print(f"{sys.argv[2]}: called vulnerabilities in modules: {len(mods)}; in the standard library of this toolchain: {len(std)}")
for m in mods:
    print("  module:", m)
for k in std:
    print("  standard library:", k)
for k in sorted(set(other) - set(called)):
    print(f"  not called: {k} ({other[k][0]}, {other[k][1]})")
sys.exit(1 if mods or std else 0)
PY
}
status=0
scan "$root" core || status=1
scan "$root/examples" examples || status=1
exit $status
