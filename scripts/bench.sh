#!/usr/bin/env bash
# scripts/bench.sh: runs every benchmark and prints its figures; `make bench`.
# Results are recorded by hand in bench/results.md with the machine and date.
# The Docker benchmarks run as the sbx service account (the engine refuses
# root); BENCH_DOCKER=0 leaves them out.
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory all bench-bins >/dev/null
as_sbx() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u sbx -- "$@"; else "$@"; fi
}
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%F)"
echo "== reflection filter vs memmem (bench/reflect_bench.c)"
build/bench/reflect_bench
echo "== broker round trip vs bare echo (bench/broker_bench.lua)"
build/sbx lua bench/broker_bench.lua "${BENCH_CALLS:-5000}"
echo "== safe fetch vs plain libcurl, 1 MiB body (bench/fetch_bench.lua)"
build/sbx lua bench/fetch_bench.lua "${BENCH_FETCH_ROUNDS:-200}"
echo "== rich mode streaming: broker path vs libcurl alone, 32 MiB of SSE (bench/stream_bench.lua)"
build/sbx lua bench/stream_bench.lua "${BENCH_STREAM_ROUNDS:-7}"
echo "== scrub_diagnostic on behaviour 33's inputs vs a plain scan (bench/scrub_bench.lua)"
build/sbx lua bench/scrub_bench.lua "${BENCH_SCRUB_ROUNDS:-10}"
echo "== embedding ABI round trips from C and from Bun (bench/ffi_bench.c, bench/ffi_bench.ts)"
as_sbx build/bench/ffi_bench "${BENCH_FFI_CALLS:-20000}"
as_sbx bun bench/ffi_bench.ts "${BENCH_FFI_CALLS:-20000}"
echo "== host peak memory per hostile request body, each route at its limit (bench/body_memory_bench.lua)"
as_sbx lua5.4 bench/body_memory_bench.lua
echo "== rich turn: host overhead vs model time, Lua peer worker (bench/rich_bench.lua)"
as_sbx build/sbx lua bench/rich_bench.lua "${BENCH_RICH_TURNS:-50}"
echo "== a turn with vs without the metrics reader, and one render (bench/metrics_bench.lua)"
as_sbx build/sbx lua bench/metrics_bench.lua "${BENCH_METRIC_TURNS:-500}"
if [ "${BENCH_DOCKER:-1}" = 1 ]; then
  make --no-print-directory image >/dev/null
  make --no-print-directory image-pi >/dev/null
  echo "== rich turn: host overhead vs model time, real Pi container (bench/rich_bench.lua --docker)"
  as_sbx build/sbx lua bench/rich_bench.lua "${BENCH_RICH_DOCKER_TURNS:-20}" --docker
  echo "== sealed turn vs bare docker run --rm, host RSS (bench/turn_bench.lua)"
  as_sbx build/sbx lua bench/turn_bench.lua "${BENCH_TURNS:-20}"
  echo "== warm turns: cold, warm (CLI, Engine), 32 channels at once, idle cost vs bare docker run --rm (bench/warm_bench.lua)"
  as_sbx build/sbx lua bench/warm_bench.lua "${BENCH_TURNS:-20}"
  echo "== cold turn under runsc and crun vs runc (bench/runtime_bench.lua; make deps RUNSC=1 registers them)"
  as_sbx build/sbx lua bench/runtime_bench.lua "${BENCH_TURNS:-20}"
  echo "== container drivers: CLI vs Engine API (bench/turn_overhead.lua)"
  as_sbx lua5.4 bench/turn_overhead.lua "${BENCH_TURNS:-20}"
  echo "== worker peak memory (bench/worker_rss.lua)"
  as_sbx build/sbx lua bench/worker_rss.lua
  echo "== precheck run (one granted MCP call) vs bare docker run --rm of the precheck image (bench/precheck_bench.lua)"
  as_sbx build/sbx lua bench/precheck_bench.lua "${BENCH_PRECHECKS:-20}"
  echo "== hardening: the seccomp profile vs Docker's default, the disk watchdog on vs off (bench/hardening_bench.lua)"
  as_sbx build/sbx lua bench/hardening_bench.lua "${BENCH_TURNS:-20}"
fi
