#!/usr/bin/env bash
# fuzz.sh SECONDS: builds every libFuzzer harness fuzz/<name>_fuzz.c and runs
# each for SECONDS (run by `make fuzz` for 60 s, `make fuzz-check` for 10 s).
#
# Build (into build-fuzz/): the core's sources (core/*.c except main.c) are
# compiled once with clang and -fsanitize=fuzzer-no-link,address,undefined;
# each harness is linked with them and -fsanitize=fuzzer,address,undefined
# against lua5.4 libuv libcurl libcrypto and http_parser. Undefined behaviour
# aborts (-fno-sanitize-recover), so UBSan findings count as crashes; leaks
# count too (LeakSanitizer, libFuzzer's default).
# `-iquote core` keeps project headers from shadowing system ones.
#
# Run: corpus build-fuzz/corpus-<name> (kept between runs), seeded from
# fuzz/seeds/<name>/ when it exists; fuzz/<name>.dict is used when present.
# Crash inputs land in build-fuzz/artifacts/. Prints one line per harness,
# `fuzz <name>: ok (...)` or `fuzz <name>: CRASH ...` (with the report's tail),
# `fuzz <name>: BUILD FAILED`; exits non-zero if any harness did not pass.
# FUZZ_ONLY=name runs just that harness; FUZZ_DIR=dir takes harnesses, seeds
# and dictionaries from dir instead of fuzz/ (to test this script).
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SBX_ROOT" || exit 1

SECONDS_EACH="${1:-10}"
case "$SECONDS_EACH" in ''|*[!0-9]*) die "usage: scripts/fuzz.sh SECONDS" ;; esac

OUT=build-fuzz
CLANG="${FUZZ_CC:-clang}"
have "$CLANG" || die "$CLANG not found: run \`make deps\`"
# The core's pkg-config packages come from the Makefile (make fuzz passes them).
PKGS="${SBX_PKGS:-$(make -s --no-print-directory -C "$SBX_ROOT" print-pkgs 2>/dev/null)}"
[ -n "$PKGS" ] || die "no package list: run \`make fuzz\` or \`make fuzz-check\`"
PKG_CFLAGS="$(pkg-config --cflags $PKGS)" || die "pkg-config: $PKGS missing: run \`make deps\`"
PKG_LIBS="$(pkg-config --libs $PKGS) -lhttp_parser"
SAN="address,undefined"
CFLAGS=(-g -O1 -std=c11 -D_GNU_SOURCE -fno-omit-frame-pointer
        -fno-sanitize-recover=undefined -iquote core $PKG_CFLAGS)

mkdir -p "$OUT/obj" "$OUT/artifacts" "$OUT/logs"

shopt -s nullglob
FZ="${FUZZ_DIR:-fuzz}"
harnesses=("$FZ"/*_fuzz.c)
if [ ${#harnesses[@]} -eq 0 ]; then
  say fuzz "no harnesses ($FZ/*_fuzz.c): nothing to run"
  exit 0
fi

# ---- the core, instrumented, compiled once -----------------------------------
hdrs=(core/*.h)
newest_hdr=""
for h in "${hdrs[@]}"; do
  [ -z "$newest_hdr" ] || [ "$h" -nt "$newest_hdr" ] && newest_hdr="$h"
done
core_objs=()
core_ok=1
for src in core/*.c; do
  [ "$src" = core/main.c ] && continue
  obj="$OUT/obj/$(basename "${src%.c}").o"
  core_objs+=("$obj")
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || { [ -n "$newest_hdr" ] && [ "$newest_hdr" -nt "$obj" ]; }; then
    if ! "$CLANG" "${CFLAGS[@]}" -fsanitize=fuzzer-no-link,$SAN -c "$src" -o "$obj" \
        >"$OUT/logs/build-core.log" 2>&1; then
      say fuzz "compiling $src failed:"
      tail -n 30 "$OUT/logs/build-core.log"
      rm -f "$obj"
      core_ok=0
    fi
  fi
done

failed=0
for harness in "${harnesses[@]}"; do
  name="$(basename "${harness%_fuzz.c}")"
  [ -n "${FUZZ_ONLY:-}" ] && [ "$FUZZ_ONLY" != "$name" ] && continue
  bin="$OUT/${name}_fuzz"
  log="$OUT/logs/$name.log"

  if [ "$core_ok" -ne 1 ]; then
    say "fuzz $name" "BUILD FAILED (the core did not compile)"
    failed=1; continue
  fi
  if ! "$CLANG" "${CFLAGS[@]}" -fsanitize=fuzzer,$SAN "$harness" "${core_objs[@]}" \
      -o "$bin" $PKG_LIBS -lm -ldl >"$log" 2>&1; then
    say "fuzz $name" "BUILD FAILED"
    tail -n 30 "$log"
    failed=1; continue
  fi

  corpus="$OUT/corpus-$name"
  mkdir -p "$corpus"
  dirs=("$corpus")
  [ -d "$FZ/seeds/$name" ] && dirs+=("$FZ/seeds/$name")
  extra=()
  [ -f "$FZ/$name.dict" ] && extra+=("-dict=$FZ/$name.dict")

  # -timeout: one input taking this long is a finding (a hang).
  start="$(now_s)"
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" \
  UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    "$bin" -max_total_time="$SECONDS_EACH" -timeout=25 -rss_limit_mb=2048 \
      -artifact_prefix="$OUT/artifacts/$name-" -print_final_stats=1 \
      "${extra[@]}" "${dirs[@]}" >>"$log" 2>&1
  rc=$?
  took="$(elapsed "$start")"
  if [ "$rc" -eq 0 ] && ! grep -qE '^(==[0-9]+==ERROR|SUMMARY: (Address|Undefined|Leak)Sanitizer)|runtime error:' "$log"; then
    runs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | tail -n1 | grep -oE '[0-9]+$')"
    corp="$(find "$corpus" -type f | wc -l)"
    say "fuzz $name" "ok (${runs:-?} runs in ${took}s, corpus $corp)"
  else
    say "fuzz $name" "CRASH (exit $rc after ${took}s; log $log; inputs in $OUT/artifacts/)"
    # The report: from its first error line on (stack included), not the
    # shadow-memory legend at its end.
    first="$(grep -nE '==ERROR|ERROR: libFuzzer|runtime error:|^==[0-9]+== ERROR' "$log" | head -n1 | cut -d: -f1)"
    echo "---- report from $log"
    if [ -n "$first" ]; then sed -n "${first},$((first + 35))p" "$log"; else tail -n 40 "$log"; fi
    grep -E 'Test unit written to' "$log" | tail -n 1
    failed=1
  fi
done

exit "$failed"
