# Build, test and run the stack locally, without Docker.
# The local stack (PostgreSQL, fauxqs for SQS, stripe-mock) is managed by
# scripts/stack.sh; its endpoints land in .stack/env.

GO         ?= go
STACK      := scripts/stack.sh
PKGS       ?= $(shell $(GO) list ./... | grep -v '/e2e$$')
# -parallel 8: the tests that call t.Parallel (each on a database and
# queues of its own) mostly wait on PostgreSQL and SQS timers, not on the CPU.
TEST_FLAGS ?= -race -count=1 -parallel 8
E2E_FLAGS  ?= -count=1 -timeout 20m

.DEFAULT_GOAL := help
.PHONY: help deps infra down test fuzz e2e soak demo demo-check bench clean distclean

## help: list the targets
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## deps: download Go modules and install the stack's tools into .tools/
deps:
	$(GO) mod download
	$(STACK) deps

## infra: start (or reuse) PostgreSQL, fauxqs and stripe-mock; writes .stack/env
## (SQS_SERVER=moto: moto instead of fauxqs; WITH_MOTO=true: moto beside it)
infra: deps
	$(STACK) infra-up

## down: stop what infra started
down:
	$(STACK) down

## test: all tests against a real stack: the unit and integration tests,
## the fuzz targets (FUZZTIME each), then the e2e suite, on fauxqs; and again on moto, a second, independent
## SQS server, the SQS packages and the e2e scenarios about the queue
## (scripts/test.sh; a summary table closes it). A stack this target brings
## up is stopped afterwards, even when tests fail (the exit status is go
## test's); one already up from `make infra` is reused and left running.
SQS_PKGS      = ./pkg/sqstransport/ ./pkg/idempotent/inboxsqs/
E2E_QUEUE_RUN = ^(TestRelayKilledAfterPublish|TestDeadLetteredCopyRedriven|TestPoisonMessagesAreParked|TestHostileMessagesAreParked|TestCopyOlderThanTheDedupeWindow|TestCopiesInjectedWithTheAWSCLI)
test: deps
	@case ' $(TEST_FLAGS) ' in *' -race '*) [ "$$($(GO) env CGO_ENABLED)" = 1 ] || { \
		echo "make test: TEST_FLAGS has -race, which needs cgo and a C compiler, and '$$($(GO) env CC)' is not one here:" >&2; \
		echo "  install gcc (Debian/Ubuntu: apt-get install gcc), or test without the race detector: make test TEST_FLAGS='-count=1 -parallel 8'" >&2; \
		exit 2; } ;; esac
	WITH_MOTO=true GO='$(GO)' PKGS='$(PKGS)' TEST_FLAGS='$(TEST_FLAGS)' E2E_FLAGS='$(E2E_FLAGS)' \
		SQS_PKGS='$(SQS_PKGS)' E2E_QUEUE_RUN='$(E2E_QUEUE_RUN)' $(STACK) with scripts/test.sh

## fuzz: each fuzz target for FUZZTIME (default 5s; make test runs this):
## the envelope decoder and each consumer's payload decoding
FUZZTIME    ?= 5s
FUZZ_TARGETS = ./pkg/events:FuzzDecode ./pkg/events:FuzzDuplicateField ./pkg/events:FuzzAppendJSON ./services/rewards/cashback/terms:FuzzDecodePayment ./services/notifications/intent/compose:FuzzBuild
fuzz:
	@GO='$(GO)' FUZZTIME='$(FUZZTIME)' scripts/fuzz.sh $(FUZZ_TARGETS)

## e2e: the duplicate / redrive / race / crash suite (e2e/), black-box against
## the four services it builds and starts on the local stack, stopped again
## afterwards; SQS_SERVER=moto runs it all on moto instead of fauxqs; E2E_STACK=compose runs it against `docker compose up` instead
## (scenarios that need process control are then skipped)
ifeq ($(E2E_STACK),compose)
e2e:
	E2E_STACK=compose $(GO) test $(E2E_FLAGS) ./e2e/...
else
e2e: deps
	$(STACK) with $(GO) test $(E2E_FLAGS) ./e2e/...
endif

## demo: the whole stack without Docker (PostgreSQL, fauxqs, stripe-mock, the
## dev SMS provider, the three services), the ₹1,200 story of docs/design.md with
## its event delivered three times, a table of what happened; then the stack
## stays up for exploring until Ctrl-C, which stops everything it started
demo: deps
	@if docker info >/dev/null 2>&1; then \
		echo "demo: Docker is running here: 'docker compose up' gives you the same stack in containers (see README)"; fi
	$(STACK) with $(GO) run ./cmd/demo

## demo-check: the demo's story without the wait; fails if its numbers are wrong
demo-check: deps
	$(STACK) with $(GO) run ./cmd/demo -no-wait

## bench: measure the library against bare PostgreSQL and SQS baselines and
## against Watermill and River (bench/peers) on the same servers, the
## services draining a 20,000-event backlog, and the four services end to
## end; prints a table and writes bench.json (flags: BENCH_FLAGS='-duration
## 3s -drain-msgs 5000 -soak 5m ...', see go run ./cmd/bench -h); 10-20
## minutes on 2 cores. Then cmd/benchstores: the DynamoDB consumer vs bare
## TransactWriteItems on moto, a 20,000-event replay with the Redis
## pre-filter off and on, the cost per message in each store
## (STORES_BENCH_FLAGS; writes bench-stores.json; about a minute).
bench: deps
	$(STACK) with sh -c '$(GO) run ./cmd/bench $(BENCH_FLAGS) && $(GO) run ./cmd/benchstores $(STORES_BENCH_FLAGS)'

## soak: the chaos soak (e2e TestChaosSoak): payments through the API for
## SOAK_DURATION (10m) while processes are SIGKILLed and restarted, PostgreSQL
## and the SQS server (fauxqs, with persistence) restarted once, duplicates
## and DLQ redrives injected; then checks nothing was lost or doubled and
## prints a table. SOAK_PAYMENTS (5000), SOAK_SEED replays a run,
## SOAK_REPLICAS (2) of every process; network faults through Toxiproxy.
SOAK_DURATION ?= 10m
SOAK_PAYMENTS ?= 5000
SOAK_REPLICAS ?= 2
soak: deps
	FAUXQS_PERSISTENCE=true SOAK_DURATION=$(SOAK_DURATION) SOAK_PAYMENTS=$(SOAK_PAYMENTS) SOAK_REPLICAS=$(SOAK_REPLICAS) \
		$(STACK) with $(GO) test -count=1 -v -run '^TestChaosSoak$$' -timeout 60m ./e2e/

## clean: stop the stack, delete its state (.stack/) and build output (bin/)
clean:
	$(STACK) clean
	rm -rf bin

## distclean: clean, and also the installed tools (.tools/)
distclean: clean
	rm -rf .tools
