#!/usr/bin/env bash
# check.sh: builds everything and runs every suite (run by `make check`, after
# `make deps`). Prints one result line per suite and, last, exactly one line
# `N passed, N failed, N skipped` summing them all; exits non-zero if anything
# failed or a suite could not run.
#
# Suites:
#   busted       spec/**/*_spec.lua except spec/docker/, against build/
#   busted-asan  the same specs against the ASan/UBSan build (build-asan/),
#                minus the tag `slow`
#   ffi          spec/c/ffi/ffi_test.c (embedding ABI) against build/; one test per case
#   ffi-shim     the same through build/libsbx_ffi.so (the RTLD_DEEPBIND loader Bun uses)
#   ffi-asan     the same against build-asan/ (ASan/UBSan, leaks checked)
#   fetch        spec/c/fetch/fetch_test.c (safe fetch's C API, core/sbx_fetch.h) against build/
#   fetch-asan   the same against build-asan/ (ASan/UBSan, leaks checked)
#   fuzz         every fuzz/*_fuzz.c for FUZZ_SECONDS (default 10); one test each
#   docker       (hook) spec/docker/*_spec.lua, real Docker (the sealed image and the
#                rich images, both built first); runs when present
#                (as root, with a 512 MiB ext4 loop filesystem for the disk
#                attack of hostile_spec.lua: SBX_TEST_LOOPFS, unmounted and
#                deleted at the end)
#   docker-runsc the same specs again with SBX_RUNTIME=runsc (every container
#                under gVisor; spec/support/docker_runtime.lua) when the daemon
#                has runsc registered (make deps RUNSC=1, which CI runs);
#                otherwise one skipped test
#   bun          (hook) `bun test` in bun/; runs when bun/package.json exists
#   install      spec/install/install_test.sh: make install DESTDIR, pkg-config,
#                luarocks make, bun pm pack + bun add, used from temporary trees
#   rich-worker  spec/rich_worker/ on bun (the rich worker, worker/pi/)
#   rich-docker  spec/docker/*.test.mjs on bun against `make image-pi`, real Docker
#
# Counting: busted runs with the output handler spec/support/count_handler.lua,
# which records passed / failed / skipped in a file of its own, apart from the
# tests' stdout; errors outside an `it` (a spec file that does not load, a
# failing before_each) count as failed, `pending` as skipped. A busted process
# that dies before its end (a sanitizer abort, a timeout) keeps what it had
# counted and adds one failure. A suite that cannot run at all (build failed,
# no service account) counts as one failure. Fuzzers count one test each.
#
# As root, the specs run as the service account `sbx` (the product refuses to
# run as root), with a fresh TMPDIR it owns; if it cannot read this checkout,
# the checkout is copied to a temporary folder it can read and run there.
# Logs: build/check-logs/<suite>.log (the tail of a failing suite's is printed).
#
# Knobs: FUZZ_SECONDS, SUITE_TIMEOUT (seconds per busted/bun run, default 900),
# CHECK_SKIP="fuzz asan" (suites to leave out while iterating; not for CI).
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SBX_ROOT" || exit 1

LOGS="$SBX_ROOT/build/check-logs"
SUITE_TIMEOUT="${SUITE_TIMEOUT:-900}"
FUZZ_SECONDS="${FUZZ_SECONDS:-10}"
CHECK_SKIP="${CHECK_SKIP:-}"
T0="$(now_s)"

rm -rf "$LOGS"
mkdir -p "$LOGS"

total_p=0 total_f=0 total_s=0
summary=()
failed_suites=()  # suites with a failure, named again in the summary

# record SUITE PASSED FAILED SKIPPED NOTE
record() {
  local suite="$1" p="$2" f="$3" s="$4" note="${5:-}"
  total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + s))
  [ "$f" -ne 0 ] && failed_suites+=("$suite")
  local l
  l="$(printf '%-12s %d passed, %d failed, %d skipped' "$suite" "$p" "$f" "$s")"
  [ -n "$note" ] && l="$l  ($note)"
  summary+=("$l")
  say "suite $suite" "$p passed, $f failed, $s skipped${note:+ ($note)}"
}

show_tail() { # show_tail LOG [LINES]
  echo "---- tail of ${1#$SBX_ROOT/}"
  tail -n "${2:-60}" "$1"
  echo "----"
}

skipped_by_knob() { case " $CHECK_SKIP " in *" $1 "*) return 0 ;; esac; return 1; }

# ---- who runs the specs ----------------------------------------------------------
RUN_AS=()         # prefix that runs a command as the spec user
WORK="$SBX_ROOT"  # the tree the specs run in
SPEC_TMP=""       # fresh TMPDIR, owned by the spec user
runner_ok=1
LOOPFS=""        # the small filesystem of the disk attack (root only)
cleanup() {
  [ -n "$SPEC_TMP" ] && rm -rf "$SPEC_TMP"
  [ -n "${COPY_DIR:-}" ] && rm -rf "$COPY_DIR"
  if [ -n "$LOOPFS" ]; then
    umount "$LOOPFS" 2>/dev/null || umount -l "$LOOPFS" 2>/dev/null
    rm -rf "$LOOPFS" "$LOOPFS.img"
  fi
}
trap cleanup EXIT

SPEC_TMP="$(mktemp -d /tmp/sbx-check.XXXXXX)" || die "mktemp failed"
chmod 0700 "$SPEC_TMP"
if is_root; then
  if ! id "$SBX_USER" >/dev/null 2>&1; then
    say check "the service account $SBX_USER does not exist: run \`make deps\` as root"
    runner_ok=0
  else
    chown "$SBX_USER:" "$SPEC_TMP"
    SBX_HOME="$(getent passwd "$SBX_USER" | cut -d: -f6)"
    RUN_AS=(runuser -u "$SBX_USER" -- env "HOME=${SBX_HOME:-$SPEC_TMP}" "USER=$SBX_USER" "LOGNAME=$SBX_USER")
    say check "running as root: the specs run as the service account $SBX_USER (uid $(id -u "$SBX_USER"))"
  fi
fi

# True if the spec user can read every file of the checkout (except .git).
tree_readable() {
  local out
  out="$("${RUN_AS[@]}" find "$SBX_ROOT" -path "$SBX_ROOT/.git" -prune -o \
          -path "$SBX_ROOT/build-fuzz" -prune -o \( ! -readable -print -quit \) 2>&1)" || return 1
  [ -z "$out" ]
}

# Copies the checkout (with its builds) to a folder the spec user owns.
make_copy() {
  [ -n "${COPY_DIR:-}" ] && rm -rf "$COPY_DIR"
  COPY_DIR="$(mktemp -d /tmp/sbx-check-tree.XXXXXX)" || return 1
  chmod 0755 "$COPY_DIR"
  tar -C "$SBX_ROOT" --exclude=./.git --exclude=./build-fuzz --exclude=./build/check-logs -cf - . |
    tar -C "$COPY_DIR" -xf - || return 1
  chown -R "$SBX_USER:" "$COPY_DIR"
  WORK="$COPY_DIR"
}

# ---- build ---------------------------------------------------------------------
build_ok=1
say check "building (make all c-tests)"
if ! make --no-print-directory -j"$(nproc)" all c-tests >"$LOGS/build.log" 2>&1; then
  build_ok=0
  say check "make all c-tests FAILED"
  show_tail "$LOGS/build.log" 40
fi
asan_build_ok=1
if ! skipped_by_knob asan; then
  say check "building the sanitizer build (make check-asan)"
  if ! make --no-print-directory -j"$(nproc)" check-asan >"$LOGS/build-asan.log" 2>&1; then
    asan_build_ok=0
    say check "make check-asan FAILED"
    show_tail "$LOGS/build-asan.log" 40
  fi
fi

if [ "$runner_ok" -eq 1 ] && is_root; then
  if tree_readable; then
    WORK="$SBX_ROOT"
  else
    say check "$SBX_USER cannot read $SBX_ROOT (e.g. it is under a 0700 home): copying the checkout to a temporary folder it can read"
    if make_copy; then
      say check "specs run in the copy $WORK"
    else
      say check "copying the checkout failed"
      runner_ok=0
    fi
  fi
fi


# run_busted SUITE LOG [busted args...]: runs busted in $WORK as the spec user
# with the counting handler, then records the suite.
run_busted() {
  local suite="$1" log="$2"; shift 2
  local counts="$SPEC_TMP/$suite.counts" tmp="$SPEC_TMP/tmp-$suite"
  rm -f "$counts"
  mkdir -p "$tmp" && chmod 0700 "$tmp"
  is_root && chown "$SBX_USER:" "$tmp"
  local start rc
  start="$(now_s)"
  (
    cd "$WORK" &&
      "${RUN_AS[@]}" env "TMPDIR=$tmp" ${BUSTED_ENV[@]+"${BUSTED_ENV[@]}"} \
        timeout -k 10 "$SUITE_TIMEOUT" lua5.4 /usr/bin/busted \
        -o spec/support/count_handler.lua -Xoutput "$counts" "$@"
  ) >"$log" 2>&1 </dev/null
  rc=$?
  local took; took="$(elapsed "$start")"
  local p=0 f=0 s=0 state="missing" note=""
  if [ -f "$counts" ]; then read -r p f s state <"$counts" || true; fi
  if [ "$state" != done ]; then
    f=$((f + 1))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then note="timed out after ${SUITE_TIMEOUT}s"
    else note="busted died (exit $rc) before the end of the run"; fi
  elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1; note="busted exited $rc after reporting no failure"
  fi
  note="${note:+$note; }${took}s"
  record "$suite" "$p" "$f" "$s" "$note"
  if [ "$state" != done ]; then show_crash "$log"
  elif [ "$f" -ne 0 ]; then show_tail "$log" 80; fi
}

# show_crash LOG: for a run that died: the test it was in and the head of the
# sanitizer report (its stack), not the shadow-memory legend at its end.
show_crash() {
  local log="$1" first last
  last="$(grep -E '^\.\.\.\. ' "$log" | tail -n 1)"
  echo "---- ${log#$SBX_ROOT/}: died during: ${last#.... }"
  first="$(grep -nE '==ERROR|runtime error:|^==[0-9]+== ?ERROR' "$log" | head -n 1 | cut -d: -f1)"
  if [ -n "$first" ]; then
    # Interpreter frames (lua5.4 has no symbols) say nothing: leave them out,
    # so the use, free and allocation stacks all fit.
    sed -n "$((first > 3 ? first - 3 : 1)),$((first + 300))p" "$log" |
      sed '/^Shadow bytes around/,$d' | grep -v '(/usr/bin/lua5\.4+0x' | head -n 70
  else
    tail -n 40 "$log"
  fi
  echo "----"
}

# The spec files: every *_spec.lua under spec/ except spec/docker/.
mapfile -t SPECS < <(cd "$SBX_ROOT" && find spec -name '*_spec.lua' -not -path 'spec/docker/*' | LC_ALL=C sort)

# ---- the worker image, once, for every suite that runs real Docker ----------------
# When the daemon answers and the image builds, the real-Docker cases (opt-in
# with SANDBOX_DOCKER_TEST=1) run in the busted suite and the docker suite.
docker_state="unknown"
if [ "$build_ok" -ne 1 ]; then
  docker_state="make all failed"
elif ! timeout 20 docker info >/dev/null 2>&1; then
  docker_state="the Docker daemon does not answer (make deps starts it)"
elif ! make --no-print-directory image >"$LOGS/image.log" 2>&1; then
  docker_state="make image failed (build/check-logs/image.log)"
  show_tail "$LOGS/image.log" 40
else
  docker_state="ok"
  if [ "$WORK" != "$SBX_ROOT" ]; then make_copy || true; fi  # pick up the image build's outputs
fi
# The rich (Pi) images, once, before every suite that runs them: the docker
# suite's rich runtime spec and the rich-docker suite.
pi_state="not built"
if [ "$docker_state" = ok ] && [ -f worker/pi/package.json ]; then
  if make --no-print-directory image-pi >"$LOGS/image-pi.log" 2>&1; then
    pi_state="ok"
  else
    pi_state="make image-pi failed (build/check-logs/image-pi.log)"
    show_tail "$LOGS/image-pi.log" 40
  fi
fi
DOCKER_ENV=()
[ "$docker_state" = ok ] && DOCKER_ENV=("SANDBOX_DOCKER_TEST=1")

# can_run SUITE BUILD: true when SUITE may run against BUILD ("build" or
# "asan"); otherwise records the one failure that says why it could not (or,
# for the sanitizer build left out by CHECK_SKIP, says so and records nothing).
can_run() {
  local suite="$1" build="$2"
  if [ "$build" = asan ] && skipped_by_knob asan; then
    say check "suite $suite: left out (CHECK_SKIP)"
    return 1
  elif [ "$runner_ok" -ne 1 ]; then
    record "$suite" 0 1 0 "could not run: no user to run the tests as"
  elif [ "$build" = build ] && [ "$build_ok" -ne 1 ]; then
    record "$suite" 0 1 0 "could not run: make all c-tests failed (build/check-logs/build.log)"
  elif [ "$build" = asan ] && [ "$asan_build_ok" -ne 1 ]; then
    record "$suite" 0 1 0 "could not run: make check-asan failed (build/check-logs/build-asan.log)"
  else
    return 0
  fi
  return 1
}

# ---- suite: busted --------------------------------------------------------------
if can_run busted build; then
  if [ ${#SPECS[@]} -eq 0 ]; then
    record busted 0 0 0 "no spec files"
  else
    BUSTED_ENV=(${DOCKER_ENV[@]+"${DOCKER_ENV[@]}"})
    say check "suite busted: ${#SPECS[@]} spec files against build/"
    run_busted busted "$LOGS/busted.log" --cpath='build/lua/?.so' "${SPECS[@]}"
    BUSTED_ENV=()
  fi
fi

# ---- suite: busted-asan ---------------------------------------------------------
if can_run busted-asan asan; then
  if [ ${#SPECS[@]} -eq 0 ]; then
    record busted-asan 0 0 0 "no spec files"
  else
    # lua5.4 is not instrumented, so the ASan runtime must be loaded first.
    preload="$(gcc -print-file-name=libasan.so)"
    ubsan="$(gcc -print-file-name=libubsan.so)"
    [ -e "$ubsan" ] && preload="$preload:$ubsan"
    BUSTED_ENV=(
      "LD_PRELOAD=$preload"
      "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1"
      "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
    )
    say check "suite busted-asan: ${#SPECS[@]} spec files against build-asan/ (without #slow)"
    run_busted busted-asan "$LOGS/busted-asan.log" --cpath='build-asan/lua/?.so' \
      --exclude-tags=slow "${SPECS[@]}"
    BUSTED_ENV=()
  fi
fi

# ---- suites: ffi / ffi-shim / ffi-asan / fetch / fetch-asan (the C drivers) -------
# spec/c/ffi/ffi_test.c drives the embedding ABI (core/sbx_ffi.h),
# spec/c/fetch/fetch_test.c the safe-fetch C API (core/sbx_fetch.h, against a
# loopback server it starts itself), each against build/ and the sanitizer
# build (leaks checked at exit); `make all c-tests` and `make check-asan`
# built them above. One test per C test case (spec/c/runner.h): "ok   " lines
# pass, "FAIL " lines fail; a run that dies before its summary line
# "NAME: N passed, M failed" (sanitizer report, timeout) adds one failure.
# Runs as the spec user.
run_c_driver() { # run_c_driver SUITE BUILD_DIR BINARY NAME [ARGS...]
  local suite="$1" bdir="$2" bin="$3" name="$4" log="$LOGS/$1.log" start rc p f note=""
  shift 4
  start="$(now_s)"
  if [ ! -x "$bdir/$bin" ]; then
    record "$suite" 0 1 0 "could not run: $bdir/$bin was not built"
    return
  fi
  if [ "$WORK" != "$SBX_ROOT" ]; then
    for f in "$bdir/$bin" "$bdir/libsbx_ffi.so"; do
      [ -f "$f" ] && cp "$f" "$WORK/$f" && { ! is_root || chown "$SBX_USER:" "$WORK/$f"; }
    done
  fi
  (
    cd / &&
      "${RUN_AS[@]}" env "TMPDIR=$SPEC_TMP" \
        "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1" "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1" \
        timeout -k 10 "$SUITE_TIMEOUT" "$WORK/$bdir/$bin" "$@"
  ) >"$log" 2>&1 </dev/null
  rc=$?
  p="$(grep -c '^ok   ' "$log")"
  f="$(grep -c '^FAIL ' "$log")"
  if ! grep -qE "^$name: [0-9]+ passed, [0-9]+ failed\$" "$log"; then
    f=$((f + 1)); note="$bin died (exit $rc) before its summary; "
  elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1; note="$bin exited $rc after reporting no failure (a leak?); "
  fi
  record "$suite" "$p" "$f" 0 "${note}$(elapsed "$start")s"
  [ "$f" -ne 0 ] && show_tail "$log" 60
}
run_ffi() { run_c_driver "$1" "$2" "$3" ffi "$WORK/spec/c/ffi"; }
if can_run ffi build; then
  say check "suite ffi: spec/c/ffi/ffi_test.c against build/libsbx.so"
  run_ffi ffi build ffi_test
  say check "suite ffi-shim: spec/c/ffi/ffi_test.c through build/libsbx_ffi.so (the loader Bun uses)"
  run_ffi ffi-shim build ffi_test_shim
fi
if can_run ffi-asan asan; then
  say check "suite ffi-asan: spec/c/ffi/ffi_test.c against build-asan/libsbx.so"
  run_ffi ffi-asan build-asan ffi_test
fi
if can_run fetch build; then
  say check "suite fetch: spec/c/fetch/fetch_test.c against build/libsbx.a"
  run_c_driver fetch build fetch_test fetch
fi
if can_run fetch-asan asan; then
  say check "suite fetch-asan: spec/c/fetch/fetch_test.c against build-asan/libsbx.a"
  run_c_driver fetch-asan build-asan fetch_test fetch
fi

# ---- suite: fuzz ------------------------------------------------------------------
if skipped_by_knob fuzz; then
  say check "suite fuzz: left out (CHECK_SKIP)"
else
  say check "suite fuzz: each fuzz/*_fuzz.c for ${FUZZ_SECONDS}s"
  start="$(now_s)"
  FUZZ_SECONDS="$FUZZ_SECONDS" make --no-print-directory fuzz-check >"$LOGS/fuzz.log" 2>&1
  rc=$?
  fp="$(grep -cE '^fuzz [a-z0-9_]+: ok' "$LOGS/fuzz.log")"
  ff="$(grep -cE '^fuzz [a-z0-9_]+: (CRASH|BUILD FAILED)' "$LOGS/fuzz.log")"
  note="$(elapsed "$start")s"
  if [ "$rc" -ne 0 ] && [ "$ff" -eq 0 ]; then ff=1; note="fuzz.sh failed (exit $rc); $note"; fi
  if [ "$fp" -eq 0 ] && [ "$ff" -eq 0 ]; then note="no harnesses; $note"; fi
  record fuzz "$fp" "$ff" 0 "$note"
  grep -E '^fuzz [a-z0-9_]+: ' "$LOGS/fuzz.log" | sed 's/^/  /'
  [ "$ff" -ne 0 ] && show_tail "$LOGS/fuzz.log" 60
fi

# ---- hook: suite docker (spec/docker/*_spec.lua, real Docker) --------------------
# Runs only when such specs exist. As root they run as $SBX_USER, which is in
# the `docker` group (make deps). The image was built above (docker_state).
shopt -s nullglob
DOCKER_SPECS=(spec/docker/*_spec.lua)
shopt -u nullglob
if [ ${#DOCKER_SPECS[@]} -gt 0 ] && can_run docker build; then
  if [ "$docker_state" != ok ]; then
    record docker 0 1 0 "could not run: $docker_state"
  else
    # run_docker SUITE [ENV...]: the Docker specs once, with ENV added.
    run_docker() {
      local suite="$1"; shift
      BUSTED_ENV=("${DOCKER_ENV[@]}" "$@")
      # The disk attack needs a small filesystem of its own, which only root can
      # mount; the spec fails (never skips) without it.
      if is_root && have mkfs.ext4 && LOOPFS="$(mktemp -d /tmp/sbx-loopfs.XXXXXX)"; then
        if truncate -s 512M "$LOOPFS.img" && mkfs.ext4 -q -F "$LOOPFS.img" >/dev/null 2>&1 &&
           mount -o loop "$LOOPFS.img" "$LOOPFS" && chown "$SBX_USER:" "$LOOPFS" && chmod 0700 "$LOOPFS"; then
          BUSTED_ENV+=("SBX_TEST_LOOPFS=$LOOPFS")
        else
          say check "could not make the loop filesystem of the disk attack"
        fi
      fi
      run_busted "$suite" "$LOGS/$suite.log" --cpath='build/lua/?.so' "${DOCKER_SPECS[@]}"
      BUSTED_ENV=()
      if [ -n "$LOOPFS" ]; then
        umount "$LOOPFS" 2>/dev/null || umount -l "$LOOPFS" 2>/dev/null
        rm -rf "$LOOPFS" "$LOOPFS.img"
        LOOPFS=""
      fi
    }
    say check "suite docker: ${#DOCKER_SPECS[@]} spec files against real Docker"
    run_docker docker
    # The same specs under gVisor (shared/spec/warm-turns.md 4) when the daemon
    # has runsc registered (make deps RUNSC=1; CI sets it); elsewhere the pass
    # is one skipped test, never a failure.
    if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
      say check "suite docker-runsc: the same spec files with SBX_RUNTIME=runsc (gVisor)"
      run_docker docker-runsc SBX_RUNTIME=runsc
    else
      record docker-runsc 0 0 1 "not run: the daemon has no runsc runtime (make deps RUNSC=1)"
    fi
  fi
fi

# ---- hook: suite bun (bun/package.json, `bun test`) ------------------------------
if [ -f bun/package.json ] && can_run bun build; then
  if ! have bun; then
    record bun 0 1 0 "could not run: bun is not installed (make deps)"
  else
    say check "suite bun: bun test in bun/"
    start="$(now_s)"
    blog="$LOGS/bun.log"
    junit="$SPEC_TMP/bun-junit.xml"
    rm -f "$junit"
    # Dependencies are installed as the invoking user (root may write the tree).
    if grep -qE '"(dev)?[dD]ependencies"' bun/package.json && [ ! -d bun/node_modules ]; then
      (cd bun && bun install) >"$LOGS/bun-install.log" 2>&1 ||
        say check "bun install failed (build/check-logs/bun-install.log)"
      if [ "$WORK" != "$SBX_ROOT" ]; then make_copy || true; fi
    fi
    (
      cd "$WORK/bun" &&
        "${RUN_AS[@]}" env "TMPDIR=$SPEC_TMP" timeout -k 10 "$SUITE_TIMEOUT" \
          bun test --timeout=120000 --reporter=junit --reporter-outfile="$junit"
    ) >"$blog" 2>&1 </dev/null
    rc=$?
    bp=0 bf=0 bs=0 note=""
    if [ -f "$junit" ]; then
      # The <testsuites ...> element carries the totals.
      top="$(grep -m1 -oE '<testsuites[^>]*>' "$junit")"
      attr() { printf '%s' "$top" | grep -oE " $1=\"[0-9]+\"" | grep -oE '[0-9]+' || echo 0; }
      bt="$(attr tests)"; bf="$(attr failures)"; be="$(attr errors)"; bs="$(attr skipped)"
      bf=$((bf + be)); bp=$((bt - bf - bs)); [ "$bp" -lt 0 ] && bp=0
    else
      # Fall back to bun's own summary lines (" N pass", " N fail", " N skip").
      bp="$(grep -oE '^ *[0-9]+ pass' "$blog" | tail -n1 | grep -oE '[0-9]+' || echo 0)"
      bf="$(grep -oE '^ *[0-9]+ fail' "$blog" | tail -n1 | grep -oE '[0-9]+' || echo 0)"
      bs="$(grep -oE '^ *[0-9]+ (skip|todo)' "$blog" | awk '{n+=$1} END {print n+0}')"
    fi
    if [ "$rc" -ne 0 ] && [ "$bf" -eq 0 ]; then bf=1; note="bun test exited $rc; "; fi
    record bun "$bp" "$bf" "$bs" "${note}$(elapsed "$start")s"
    [ "$bf" -ne 0 ] && show_tail "$blog" 60
  fi
fi

# ---- suite: install (spec/install/install_test.sh) -------------------------------
# make install DESTDIR, pkg-config and a C host, luarocks make, bun pm pack +
# bun add, each used from its temporary tree (spec/operations.md 6). It runs
# as this user (root here: it writes the checkout's build/ and bun/) and runs
# the engine as the spec user itself; its real-Docker cases need the image.
# One test per "ok"/"FAIL"/"skip" line; a run without its summary line
# "install: N passed, M failed, K skipped" adds one failure.
if can_run install build; then
  say check "suite install: spec/install/install_test.sh (temporary trees${DOCKER_ENV[*]:+, real Docker})"
  start="$(now_s)"
  ilog="$LOGS/install.log"
  env ${DOCKER_ENV[@]+"${DOCKER_ENV[@]}"} "SBX_USER=$SBX_USER" timeout -k 10 "$SUITE_TIMEOUT" \
    bash spec/install/install_test.sh >"$ilog" 2>&1 </dev/null
  rc=$?
  ip="$(grep -c '^ok   ' "$ilog")"; if_="$(grep -c '^FAIL ' "$ilog")"; is="$(grep -c '^skip ' "$ilog")"
  note=""
  if ! grep -qE '^install: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$ilog"; then
    if_=$((if_ + 1)); note="install_test.sh died (exit $rc) before its summary; "
  elif [ "$rc" -ne 0 ] && [ "$if_" -eq 0 ]; then
    if_=1; note="install_test.sh exited $rc after reporting no failure; "
  fi
  record install "$ip" "$if_" "$is" "${note}$(elapsed "$start")s"
  [ "$if_" -ne 0 ] && show_tail "$ilog" 60
fi

# ---- suites: rich-worker, rich-docker (bun; spec/rich-mode.md 17) ------------------
# The rich worker's specs run on bun against the real Pi packages pinned by
# worker/pi/bun.lock (installed here when missing): spec/rich_worker/ always,
# spec/docker/*.test.mjs against the images `make image-pi` builds, with real
# Docker. As the spec user (Claude Code refuses root). Counted from bun's junit.
if [ -f worker/pi/package.json ]; then
  run_rich() { # run_rich SUITE ENV... -- FILES...
    local suite="$1" env=() files=() start rc junit="$SPEC_TMP/$1-junit.xml" log="$LOGS/$1.log" top p f s
    shift; while [ "$1" != -- ]; do env+=("$1"); shift; done; shift; files=("$@")
    start="$(now_s)"; rm -f "$junit"
    (cd "$WORK" && "${RUN_AS[@]}" env "TMPDIR=$SPEC_TMP" ${env[@]+"${env[@]}"} timeout -k 10 "$SUITE_TIMEOUT" \
      bun test --timeout=120000 --reporter=junit --reporter-outfile="$junit" "${files[@]}") >"$log" 2>&1 </dev/null
    rc=$?
    top="$(grep -m1 -oE '<testsuites[^>]*>' "$junit" 2>/dev/null)"
    n() { printf '%s' "$top" | grep -oE " $1=\"[0-9]+\"" | grep -oE '[0-9]+' || echo 0; }
    f=$(( $(n failures) + $(n errors) )); s="$(n skipped)"; p=$(( $(n tests) - f - s ))
    [ "$p" -lt 0 ] && p=0
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    record "$suite" "$p" "$f" "$s" "$(elapsed "$start")s"
    [ "$f" -ne 0 ] && show_tail "$log" 60
  }
  if [ "$runner_ok" -ne 1 ] || ! have bun; then
    record rich-worker 0 1 0 "could not run: no spec user or no bun (make deps)"
  else
    if [ ! -d worker/pi/node_modules ]; then
      (cd worker/pi && bun install --frozen-lockfile) >"$LOGS/rich-install.log" 2>&1 ||
        say check "bun install in worker/pi failed (build/check-logs/rich-install.log)"
      if [ "$WORK" != "$SBX_ROOT" ]; then make_copy || true; fi
    fi
    say check "suite rich-worker: bun test spec/rich_worker/"
    run_rich rich-worker -- ./spec/rich_worker/
    shopt -s nullglob; RICH_DOCKER=(spec/docker/*.test.mjs); shopt -u nullglob
    if [ ${#RICH_DOCKER[@]} -gt 0 ]; then
      if [ "$docker_state" != ok ]; then
        record rich-docker 0 1 0 "could not run: $docker_state"
      elif [ "$pi_state" != ok ]; then
        record rich-docker 0 1 0 "could not run: $pi_state"
      else
        say check "suite rich-docker: ${RICH_DOCKER[*]} against real Docker"
        run_rich rich-docker SANDBOX_DOCKER_TEST=1 -- "${RICH_DOCKER[@]/#/./}"
      fi
    fi
  fi
fi

# ---- summary -------------------------------------------------------------------
echo
echo "==== check summary ($(elapsed "$T0")s)"
for l in "${summary[@]}"; do echo "  $l"; done
if [ "$total_f" -ne 0 ]; then
  # What failed, where CI's tail shows it: each failing suite's failures
  # (busted: name, file:line and message; bun: its "(fail)" lines),
  # bounded so a flood of failures cannot bury the summary.
  for s in "${failed_suites[@]}"; do
    [ -f "$LOGS/$s.log" ] || continue
    echo "---- failures in $s (build/check-logs/$s.log)"
    if grep -q -a '^Failures and errors (' "$LOGS/$s.log"; then
      sed -n '/^Failures and errors (/,$p' "$LOGS/$s.log"
    else
      grep -a -E '^\(fail\)|^FAIL|^ERR ' "$LOGS/$s.log"
    fi | cut -c1-300 | head -n 40
  done
  echo "FAILED: see build/check-logs/"
fi
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
