# idemproxy — `make help` lists the targets.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The chart deploys ghcr.io/idemproxy/idemproxy:<appVersion> unless image.tag
# is set, so docker-build tags the image with the chart's appVersion too.
APP_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/idemproxy/Chart.yaml)
IMG     ?= ghcr.io/idemproxy/idemproxy:$(APP_VERSION)
GO      ?= go
# Where `make run` starts the demo upstream when UPSTREAM_URL is not set. The
# demo binds it before idemproxy starts; when it cannot, `make run` fails.
DEMO_UPSTREAM_ADDR ?= 127.0.0.1:9000
# How long each demo POST takes (make run DEMO_DELAY=2s shows a 409).
DEMO_DELAY ?= 0s
# Short by default so `make test` stays quick; lengthen with FUZZTIME=1m.
FUZZTIME ?= 10s

.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show this help (coloured only on a terminal)
	@if [ -t 1 ]; then c='\033[36m' b='\033[1m' r='\033[0m'; else c= b= r=; fi; \
	awk -v c="$$c" -v b="$$b" -v r="$$r" 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
		/^[a-zA-Z_0-9-]+:.*?##/ { printf "  %s%-16s%s %s\n", c, $$1, r, $$2 } \
		/^##@/ { printf "\n%s%s%s\n", b, substr($$0, 5), r }' $(MAKEFILE_LIST)

##@ Development

.PHONY: run
run: announce-build build ## Run the proxy (embedded Redis; a demo upstream on DEMO_UPSTREAM_ADDR unless UPSTREAM_URL is set; Ctrl-C stops all)
	@if [ -n "$$UPSTREAM_URL" ]; then exec ./bin/idemproxy; fi; \
	$(GO) build -o bin/demoupstream ./internal/demoupstream || exit 1; \
	exec ./bin/demoupstream -addr '$(DEMO_UPSTREAM_ADDR)' -delay '$(DEMO_DELAY)' -- ./bin/idemproxy

# The first build downloads the modules and prints nothing for half a minute.
.PHONY: announce-build
announce-build:
	@echo "make run: building bin/idemproxy (the first build downloads modules and takes about 30 s)"

.PHONY: deps
deps: ## Install what the tests need: redis-server and redis-cli (apt), when missing
	@scripts/install-deps.sh

# The end-to-end tests are the package internal/e2e, chosen by folder: they
# build the binary and run it against real Redis (standalone, Cluster,
# Sentinel), kill and restart redis-server and the proxy, and drive `make
# run`. test-go runs them with the rest (./...), in parallel with the other
# packages; test-integration runs them alone.

.PHONY: test
test: deps test-go chart-test ## Run ALL tests: Go (unit, real Redis, and internal/e2e: the binary, Cluster, Sentinel, soak; -race) and the Helm chart

.PHONY: test-go
test-go: deps ## Run the Go tests with -race (fuzz seeds and internal/e2e included); package claim once more with string records
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-go-packages test-go-string-records

# The two runs of test-go go side by side (each one's output whole, when it
# ends): the tests mostly wait on Redis, timers and child processes, so
# one after the other would leave the CPU idle for minutes.
.PHONY: test-go-packages test-go-string-records
test-go-packages:
	$(GO) test -race -count=1 -timeout 15m ./...
test-go-string-records:
	CLAIM_TEST_RECORD_FORMAT=string $(GO) test -race -count=1 -timeout 5m ./claim

.PHONY: test-integration
test-integration: deps ## Run only the end-to-end tests, internal/e2e (the binary, Cluster, Sentinel, soak, Redis kill/restart, make run)
	$(GO) test -race -count=1 -timeout 15m ./internal/e2e/...

.PHONY: fuzz
fuzz: ## Fuzz key parsing, ROUTES, key sources, JSON pointers and record decoding for FUZZTIME each
	$(GO) test -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime $(FUZZTIME) ./proxy
	$(GO) test -run '^$$' -fuzz '^FuzzParseRoutes$$' -fuzztime $(FUZZTIME) ./proxy
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME) ./claim
	$(GO) test -run '^$$' -fuzz '^FuzzParseKeySource$$' -fuzztime $(FUZZTIME) ./proxy
	$(GO) test -run '^$$' -fuzz '^FuzzJSONPointer$$' -fuzztime $(FUZZTIME) ./proxy/jsonpointer
	$(GO) test -run '^$$' -fuzz '^FuzzParsePointer$$' -fuzztime $(FUZZTIME) ./proxy/jsonpointer

.PHONY: lint
lint: ## gofmt, go vet and go mod tidy must leave nothing to change
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff

# make chaos: every random choice of a run comes from SEED; DURATION is each
# row's fault phase; ROWS (row names, comma-separated, or regexps) runs only those;
# CHAOS_OUT keeps each row's history (JSON) and matrix.md.
SEED      ?= 1
DURATION  ?= 15s
ROWS      ?=
CHAOS_OUT ?=

.PHONY: chaos
chaos: deps ## Run the chaos matrix, faults x configurations (~10 min; docs/reliability.md). SEED, DURATION, ROWS, CHAOS_OUT
	$(GO) test -count=1 -v -timeout 40m -run '^TestMatrix$$' ./internal/chaos \
		-chaos.matrix -chaos.seed=$(SEED) -chaos.duration=$(DURATION) -chaos.rows='$(ROWS)' -chaos.out='$(CHAOS_OUT)'

.PHONY: chaos-ci
chaos-ci: deps ## The chaos matrix's CI slice: four rows, fixed seed, ~90 s; fails on a silent duplicate, wrong replay or lost answer
	$(GO) test -count=1 -v -timeout 5m -run '^TestMatrix$$' ./internal/chaos -chaos.ci -chaos.seed=7 -chaos.duration=10s

.PHONY: bench
bench: ## Benchmark against a bare httputil.ReverseProxy, real Redis (~6 min; docs/performance.md). BENCH_FLAGS=-quick for a smoke test
	scripts/bench.sh $(BENCH_FLAGS)

.PHONY: bench-go
bench-go: ## Go micro-benchmarks of the hot path, with allocations
	$(GO) test -run '^$$' -bench . -benchmem ./proxy ./claim

##@ Build

.PHONY: build
build: ## Build bin/idemproxy
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/idemproxy .

.PHONY: build-static
build-static: ## Build the static release binary exactly as the Dockerfile does
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o bin/idemproxy .

##@ Packaging

.PHONY: docker-build
docker-build: ## Build the container image $(IMG), the chart's default (needs a Docker engine); IMG=repo:tag for another
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) -t $(IMG) .

.PHONY: helm
helm: ## Install the pinned Helm with go install, unless it is already there
	@charts/validate/install-helm.sh >/dev/null

.PHONY: promtool
promtool: ## Install promtool (from Debian's prometheus package, into a cache) unless it is already there
	@charts/validate/install-promtool.sh >/dev/null

.PHONY: chart-lint
chart-lint: ## helm lint --strict and helm template: default values and every ci/*-values.yaml
	@set -e; helm="$$(charts/validate/install-helm.sh)"; \
	"$$helm" lint --strict charts/idemproxy; \
	"$$helm" template idem charts/idemproxy >/dev/null; \
	for f in charts/idemproxy/ci/*-values.yaml; do \
	  "$$helm" lint --strict charts/idemproxy -f "$$f"; \
	  "$$helm" template idem charts/idemproxy -f "$$f" >/dev/null; \
	done

.PHONY: chart-test
chart-test: chart-lint ## Render the chart, decode every manifest strictly into the k8s.io/api types; promtool checks and unit-tests the alerts
	@set -e; helm="$$(charts/validate/install-helm.sh)"; \
	promtool="$$(charts/validate/install-promtool.sh)" || { \
	  if [ "$$CI" = true ]; then echo "chart-test: promtool is required in CI (CI=true)"; exit 1; fi; \
	  echo "chart-test: no promtool, so the alert tests will SKIP (they fail when CI=true)"; promtool=; }; \
	cd charts/validate; \
	test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }; \
	$(GO) vet ./...; \
	$(GO) mod tidy -diff; \
	HELM="$$helm" PROMTOOL="$$promtool" $(GO) test -count=1 ./...

.PHONY: clean
clean: ## Remove build output
	rm -rf bin
