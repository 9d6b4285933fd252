#!/usr/bin/env bash
# The body of `make test`, run inside the local stack with WITH_MOTO=true
# so that .stack/env names both SQS servers: fauxqs (AWS_ENDPOINT_URL) and
# moto (MOTO_ENDPOINT_URL). By hand, E2E_QUEUE_RUN (the e2e scenarios to
# run again on moto: the Makefile's, for make test) must be given, e.g.
#   WITH_MOTO=true E2E_QUEUE_RUN='^TestRelayKilledAfterPublish' scripts/stack.sh with scripts/test.sh
# In order, stopping at the first failure:
#
#   1. every package compiled once, without -race: what the tests that
#      build the services (internal/stack, layering, template) then find
#      in the build cache instead of compiling it side by side, each in
#      its own go build
#   2. the unit and integration tests, SQS on fauxqs
#   3. the SQS packages (SQS_PKGS) again, on moto
#   4. the fuzz targets (make fuzz)
#   5. the e2e suite, on fauxqs
#   6. the e2e scenarios about the queue (E2E_QUEUE_RUN) again, on moto
#
# Each step is announced with the server it runs on, e2e runs list every
# scenario's result, and a table of the steps, their results and times
# closes the run. Where moto is missing, its steps are skipped, saying why.
# The full output of each e2e run is kept in .stack/logs/e2e-<server>.out.
#
# Settings (environment, set by the Makefile): GO, PKGS, TEST_FLAGS,
# E2E_FLAGS, SQS_PKGS (each with a default here), E2E_QUEUE_RUN (none).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GO=${GO:-go}
MAKE=make # not $(MAKE): a recipe naming it would run under make -n
TEST_FLAGS=${TEST_FLAGS:--race -count=1 -parallel 8}
E2E_FLAGS=${E2E_FLAGS:--count=1 -timeout 20m}
SQS_PKGS=${SQS_PKGS:-./pkg/sqstransport/ ./pkg/idempotent/inboxsqs/}
PKGS=${PKGS:-$(cd "$ROOT" && $GO list ./... | grep -v '/e2e$')}
E2E_QUEUE_RUN=${E2E_QUEUE_RUN:?E2E_QUEUE_RUN: the scenarios to run on moto}

rows=()
t_start=$SECONDS
report() {
	echo
	echo "==> make test: summary"
	printf '  %-52s %-7s %6s\n' step result time
	local r
	for r in "${rows[@]}"; do echo "  $r"; done
	printf '  %-52s %-7s %5ss\n' total "" $((SECONDS - t_start))
}
trap report EXIT

# step NAME CMD…: run CMD under a banner, add its row; exit on failure.
step() {
	local name=$1 t0=$SECONDS rc=0
	shift
	echo
	echo "==> $name"
	"$@" || rc=$?
	local result=ok
	((rc == 0)) || result=FAIL
	rows+=("$(printf '%-52s %-7s %5ss' "$name" "$result" $((SECONDS - t0)))")
	((rc == 0)) || exit "$rc"
}

skip() { # NAME WHY
	echo
	echo "==> $1: skipped: $2"
	rows+=("$(printf '%-52s %-7s %6s' "$1" skipped -)")
}

# e2e SERVER ARGS…: go test -v on ./e2e/, printing every line but the
# scenario start/pause markers (so each scenario's --- PASS/FAIL shows),
# the whole output kept in .stack/logs/e2e-SERVER.out.
e2e() {
	local server=$1 out
	shift
	out=$ROOT/.stack/logs/e2e-$server.out
	mkdir -p "$(dirname "$out")"
	SQS_SERVER=$server $GO test $E2E_FLAGS -v "$@" ./e2e/ 2>&1 | tee "$out" | grep -vE '^=== (RUN|PAUSE|CONT|NAME)'
	return "${PIPESTATUS[0]}"
}

cd "$ROOT" || exit 1
# The stack's own server (SQS_SERVER=moto make test puts moto there, and
# then there is no second server to repeat anything on).
main=${SQS_SERVER:-fauxqs}
second=
if [[ $main == fauxqs && -n ${MOTO_ENDPOINT_URL:-} ]]; then second=moto; fi
why=${MOTO_UNAVAILABLE:-no moto in this stack}
[[ $main == moto ]] && why="moto is the stack's only SQS server"
# shellcheck disable=SC2086 # the lists are word lists
{
	step "compile every package" $GO list -export -deps -f '' ./...
	step "unit and integration tests (SQS: $main)" $GO test $TEST_FLAGS $PKGS
	if [[ -n $second ]]; then
		step "SQS packages (SQS: moto)" env SQS_SERVER=moto $GO test $TEST_FLAGS $SQS_PKGS
	else
		skip "SQS packages on a second server" "$why"
	fi
	step "fuzz targets" $MAKE --no-print-directory fuzz
	step "e2e suite (SQS: $main)" e2e "$main"
	if [[ -n $second ]]; then
		step "e2e queue scenarios (SQS: moto)" e2e moto -run "$E2E_QUEUE_RUN"
	else
		skip "e2e queue scenarios on a second server" "$why"
	fi
}
