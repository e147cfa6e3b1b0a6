#!/bin/sh
# Runs every fuzz target of the module and of the examples (one workspace)
# for FUZZTIME each (default 30s), one after the other. The targets are
# found in the sources, so that a new one is fuzzed without being listed
# anywhere. `make test` runs their seed corpora as ordinary tests.
set -eu
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-30s}
grep -rl --include='*_test.go' --exclude-dir=.cache '^func Fuzz' . | sort | while read -r file; do
	dir=$(dirname "$file")
	for fn in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
		echo "== $dir $fn ($FUZZTIME)"
		"$GO" test -run '^$' -fuzz "^$fn\$" -fuzztime "$FUZZTIME" "$dir"
	done
done
