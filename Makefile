# ackgate developer targets.
#
#   make run    Postgres + Redis, migrate, example downstream on :9090, gateway
#               on :8080 (ingest) and :8081 (admin) with examples/routes.yaml;
#               prints the line to export for `bin/gateway ops` (make cli-env)
#   make test   services, lint, race-enabled tests, then each fuzz target
#               briefly (make fuzz; FUZZTIME=10000x)
#   make build  binaries into $(BIN_DIR), stamped with $(VERSION)
#   make lint   vet, gofmt check, staticcheck
#   make soak   crash-and-fault soak: two gateways, 10,000 messages, every
#               fault; prints the invariants (docs/reliability.md)
#   make drill  failover drill: Patroni switchover and leader kill, Redis
#               Cluster and Sentinel failovers, a gateway partitioned from
#               Redis and Postgres, under load; prints what each cost and
#               the invariants (root; not part of test)
#   make bench  bench-load, then bench-go
#   make bench-load
#               cmd/loadgen: a gateway process side by side with the bare
#               two-statement op and a forwarder without a ledger, and the
#               ratios docs/performance.md reports (LOADGEN_FLAGS="-n 2000")
#   make bench-go
#               go test benchmarks of one delivery through the handlers,
#               with allocations per delivery
#   make bench-purge
#               cmd/purgebench: the retention purge of 1,000,000 expired
#               operations while deliveries continue, against a baseline
#               (PURGEBENCH_FLAGS="-n 200000"); not part of make bench

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO ?= go
BIN_DIR ?= bin
ROUTES_FILE ?= examples/routes.yaml
# Development only; serve refuses tokens shorter than 16 characters.
DEV_ADMIN_TOKEN ?= dev-admin-token-not-a-secret
DOWNSTREAM_ADDR ?= 127.0.0.1:9090
BENCHTIME ?= 3s
BENCHCOUNT ?= 3

.PHONY: all build run cli-env test lint vet fmt-check staticcheck services chromium fuzz bench bench-load bench-go bench-purge soak drill console-screenshots

all: lint build

# What `gateway version` prints and service.version on every span: the
# commit, or the tag on it. The Dockerfile takes it as its VERSION argument.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

build:
	$(GO) build -ldflags "-X github.com/ackgate/ackgate/telemetry.version=$(VERSION)" -o $(BIN_DIR)/ ./cmd/...

services:
	./scripts/services.sh

# The console's browser test drives Debian's chromium.
chromium:
	./scripts/chromium.sh

vet:
	$(GO) vet ./...

# Fails, listing them, when any Go file is not gofmt-formatted.
fmt-check:
	@files="$$(gofmt -l .)"; \
	if [[ -n "$$files" ]]; then \
		echo "gofmt needed on:"; echo "$$files"; exit 1; \
	fi

# staticcheck is pinned so that a new release cannot fail a build by itself;
# go run fetches it through the module proxy on first use.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

staticcheck:
	$(GO) run $(STATICCHECK) ./...

lint: vet fmt-check staticcheck

test: services chromium lint
	$(GO) test -race -count=1 ./...
	$(MAKE) --no-print-directory fuzz

# Every fuzz target for FUZZTIME each (go test takes one target per run). The
# budget is a count of executions, not a duration: when a wall-clock
# -fuzztime runs out while a worker is still busy with a new input, go test
# can report "context deadline exceeded" as a failure with nothing found.
# A count has no deadline to race, and does the same work on a busy machine.
# Minimizing an input (each new one that widens coverage, and a failing one)
# is bounded the same way: its default is a minute of wall clock per input.
# A failing input is written to the package's testdata/fuzz and fails the run;
# committed there, it stays a regression seed of the ordinary tests.
FUZZTIME ?= 10000x
FUZZMINIMIZE ?= 2000x
FUZZ_TARGETS := ./brokerauth:FuzzSNSVerify ./handlers:FuzzDecodePubSubWrapped \
	./handlers:FuzzDecodePubSubUnwrapped ./handlers:FuzzDecodeSNS \
	./handlers:FuzzPushPubSub ./handlers:FuzzPushPubSubUnwrapped ./handlers:FuzzAdminQuery \
	./handlers:FuzzAdminResolve \
	./downstream:FuzzEncoders ./internal/seal:FuzzSealRoundTrip

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($(FUZZTIME))"; \
		$(GO) test -run='^$$' -fuzz="^$${t#*:}\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZE) "$${t%%:*}" || exit 1; \
	done

# What `gateway ops` needs in another shell to reach the gateway `make run`
# starts; run prints it, and the README's walk-through exports it.
ADMIN_PORT = $(lastword $(subst :, ,$(or $(GATEWAY_ADMIN_ADDR),:8081)))

cli-env:
	@echo "export GATEWAY_ADMIN_URL=http://127.0.0.1:$(ADMIN_PORT) GATEWAY_ADMIN_TOKEN=$(DEV_ADMIN_TOKEN)"

# The binaries are run directly rather than through `go run`, so that the
# trap's kill reaches the downstream server itself (go run would leave its
# child behind). Ctrl-C stops the gateway, and the trap stops the downstream.
run: services build
	GATEWAY_ROUTES_FILE=$(ROUTES_FILE) $(BIN_DIR)/gateway migrate
	@if command -v psql >/dev/null; then \
		psql -X -q -v ON_ERROR_STOP=1 "$${GATEWAY_DATABASE_URL:-postgres://ackgate:ackgate@127.0.0.1:5432/ackgate?sslmode=disable}" -f examples/local.sql; \
	else \
		echo "run: no psql here; apply examples/local.sql to the ledger's database for the orders-local route"; \
	fi
	@downstream=""; \
	stop_downstream() { \
		if [[ -n "$$downstream" ]] && kill -0 "$$downstream" 2>/dev/null; then \
			echo "run: stopping example downstream (pid $$downstream)"; \
			kill "$$downstream" 2>/dev/null || true; \
			wait "$$downstream" 2>/dev/null || true; \
		fi; \
	}; \
	trap stop_downstream EXIT; \
	trap 'exit 130' INT TERM; \
	$(BIN_DIR)/exampledownstream & downstream=$$!; \
	echo "run: example downstream started (pid $$downstream), waiting for $(DOWNSTREAM_ADDR)"; \
	for i in $$(seq 1 50); do \
		if (exec 3<>/dev/tcp/$(subst :,/,$(DOWNSTREAM_ADDR))) 2>/dev/null; then break; fi; \
		kill -0 "$$downstream" 2>/dev/null || { echo "run: example downstream exited"; exit 1; }; \
		sleep 0.1; \
	done; \
	echo "run: starting gateway; ingest $${GATEWAY_LISTEN_ADDR:-:8080}, admin $${GATEWAY_ADMIN_ADDR:-:8081}"; \
	echo "run: for bin/gateway ops in another shell:"; \
	echo "  $$($(MAKE) --no-print-directory -s cli-env)"; \
	GATEWAY_ROUTES_FILE=$(ROUTES_FILE) GATEWAY_ADMIN_TOKEN=$(DEV_ADMIN_TOKEN) $(BIN_DIR)/gateway serve

# The console's pictures in docs/console.md, taken by its browser test
# (console/browser_test.go) on a real gateway; commit the PNGs it rewrites.
console-screenshots: services chromium
	ACKGATE_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console $(GO) test -count=1 -run '^TestConsoleInBrowser$$' ./console/

# Figures, not checks: neither is part of test, and each fails only when it
# cannot run. Keep the machine quiet meanwhile; WAL and checkpoints are shared
# by the whole Postgres cluster.
bench: bench-load bench-go

# The side-by-side load run: it starts its own gateway from the binary just
# built, on a database and a redis-server of its own, and prints every
# system's figures and the ratios against the performance goals.
LOADGEN_FLAGS ?=

bench-load: services build
	$(BIN_DIR)/loadgen -gateway-bin $(BIN_DIR)/gateway $(LOADGEN_FLAGS)

# Throughput and allocations of a delivery through the gateway's handlers
# in-process, against the same real services as the tests: the allocations
# per delivery that a separate gateway process cannot report.
bench-go: services
	$(GO) test -run='^$$' -bench=. -benchtime=$(BENCHTIME) -count=$(BENCHCOUNT) ./handlers/

# The purge against live deliveries: seeds a database of its own with
# expired evidence, then reports delivery latency without and during the
# purge, and the purge's rate (docs/operations.md keeps the figures).
bench-purge: services build
	$(BIN_DIR)/purgebench $(PURGEBENCH_FLAGS)

# Two gateway processes on a private Postgres cluster and a private Redis,
# driven by a Pub/Sub push simulator (or Google's emulator:
# SOAK_FLAGS='-broker emulator') against a faulty downstream, with
# SIGKILLs, Redis restarts that lose its data and a Postgres crash. Exits
# non-zero when an invariant is not 0. `make test` runs a short soak instead
# (TestShortSoak in internal/soak). Extra flags: SOAK_FLAGS (bin/soak -h).
SOAK_MESSAGES ?= 10000
SOAK_FLAGS ?=

soak: services build
	$(BIN_DIR)/soak -gateway $(BIN_DIR)/gateway -messages $(SOAK_MESSAGES) $(SOAK_FLAGS)

# Two gateway processes under steady load while the services they depend on
# fail over: Postgres under Patroni (switchover, then the leader killed),
# a Redis Cluster primary killed, a Sentinel failover and a Sentinel
# primary killed, and the second gateway cut off from Redis, then from Redis
# and Postgres. Installs patroni and etcd-server when missing. Exits non-zero
# when an invariant is not 0. DRILL_FLAGS: bin/drill -h (for example
# DRILL_FLAGS='-stages patroni -patroni-sync=false').
DRILL_FLAGS ?=

drill: services build
	./scripts/drill.sh $(BIN_DIR) $(DRILL_FLAGS)
