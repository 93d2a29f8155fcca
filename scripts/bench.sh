#!/usr/bin/env bash
# Benchmark idemproxy against a bare httputil.ReverseProxy; `make bench` runs this.
# docs/performance.md says what it measures and how to read it.
#
#   scripts/bench.sh [-quick] [-duration 8s] [-warmup 2s] [-rounds 2] [-conns 64]
#                    [-only unique,replay,mixed,nokey,unique1k,json1k,open,info,mem] [-delays 0,2ms]
#                    [-open-rates 0.5] [-open-duration 5s] [-open-warmup 1s] [-open-rounds N]
#                    [-cpus wrk=0,proxy=1,upstream=1,redis=1] [-idem-bare] [-idem-bin PATH]
#                    [-idem-env KEY=VALUE]... [-ab-bin PATH] [-ab-env KEY=VALUE]... [-keep] [-v]
#
# open: the unique workload at a fixed rate (open loop, internal/bench/openloop with the vegeta
# library) against both proxies; info: idemproxy at LOG_LEVEL=info against warn (not in the
# default set).
# A/B: -ab-bin PATH and/or -ab-env KEY=VALUE add build B (that binary, or idemproxy's with that
# environment) to every closed-loop round, so two builds alternate round by round in one run.
#
# Needs go, wrk, redis-server and taskset (wrk and redis-server are installed with apt-get when
# missing and running as root). The driver is internal/bench/run; `scripts/bench.sh -h` lists every flag.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if ! command -v go >/dev/null 2>&1; then
	echo "bench: go is not on PATH" >&2
	exit 1
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/idemproxy-bench.XXXXXX")"
if ! go build -o "$work/bench" ./internal/bench/run; then
	rm -rf "$work"
	exit 1
fi
# The driver removes $work when it ends (unless -keep) and stops every process it started.
exec "$work/bench" -repo "$root" -workdir "$work" "$@"
