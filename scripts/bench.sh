#!/usr/bin/env bash
# scripts/bench.sh: runs every benchmark and prints its figures; `make bench`.
# Results are recorded by hand in bench/results.md with the machine and date.
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory all bench-bins >/dev/null
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%F)"
echo "== reflection filter vs memmem (bench/reflect_bench.c)"
build/bench/reflect_bench
echo "== broker round trip vs bare echo (bench/broker_bench.lua)"
build/sbx lua bench/broker_bench.lua "${BENCH_CALLS:-5000}"
