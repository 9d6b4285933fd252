# Build, test and run the stack locally, without Docker.
# The local stack (PostgreSQL, fauxqs for SQS, stripe-mock) is managed by
# scripts/stack.sh; its endpoints land in .stack/env.

GO         ?= go
STACK      := scripts/stack.sh
PKGS       ?= ./...
TEST_FLAGS ?= -race -count=1

.DEFAULT_GOAL := help
.PHONY: help deps infra down test clean distclean

## help: list the targets
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## deps: download Go modules and install the stack's tools into .tools/
deps:
	$(GO) mod download
	$(STACK) deps

## infra: start (or reuse) PostgreSQL, fauxqs and stripe-mock; writes .stack/env
infra: deps
	$(STACK) infra-up

## down: stop what infra started
down:
	$(STACK) down

## test: all tests against a real stack. A stack this target brings up is
## stopped afterwards, even when tests fail (the exit status is go test's);
## one already up from `make infra` is reused and left running.
test: deps
	$(STACK) with $(GO) test $(TEST_FLAGS) $(PKGS)

## clean: stop the stack, delete its state (.stack/) and build output (bin/)
clean:
	$(STACK) clean
	rm -rf bin

## distclean: clean, and also the installed tools (.tools/)
distclean: clean
	rm -rf .tools
