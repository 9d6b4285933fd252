#!/usr/bin/env bash
# Runs each fuzz target (pkg:FuzzName) for FUZZTIME: `make fuzz`.
#
# Go 1.26's fuzz coordinator can end a run that found nothing with
# "context deadline exceeded" when -fuzztime expires while a worker is
# mid-call (go.dev/issue/75804, fixed in Go 1.27); a loaded machine makes it
# likelier. A run that fails that way, with no failing input written and no
# panic, is run again, up to twice more; any other failure fails at once.
set -uo pipefail
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-5s}

# fuzz_once PKG NAME LOG: one run, its output shown and kept in LOG.
fuzz_once() {
	$GO test -run '^$' -fuzz "^$2\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 2s "$1" 2>&1 | tee "$3"
	return "${PIPESTATUS[0]}"
}

# boundary_race LOG: did the run fail only with the coordinator's race, that
# is, is "context deadline exceeded" the test's only failure line, with no
# failing input written and no panic?
boundary_race() {
	grep -qx '    context deadline exceeded' "$1" &&
		! grep -qE 'Failing input written|panic:' "$1" &&
		! grep -E '^    ' "$1" | grep -qvx '    context deadline exceeded'
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "$@"; do
	pkg=${t%%:*} name=${t#*:}
	echo "fuzz: $name in $pkg for $FUZZTIME"
	ok=false
	for try in 1 2 3; do
		if fuzz_once "$pkg" "$name" "$log"; then
			ok=true
			break
		fi
		boundary_race "$log" || break
		((try < 3)) && echo "fuzz: $name stopped on Go's fuzztime-boundary race (go.dev/issue/75804), no failing input: running it again"
	done
	if ! $ok; then
		echo "fuzz: $name FAILED" >&2
		exit 1
	fi
done
