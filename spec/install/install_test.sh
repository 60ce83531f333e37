#!/usr/bin/env bash
# spec/install/install_test.sh: the installation specs (spec/operations.md 6
# and its behaviour 7): everything a Debian, C, Lua or Bun user installs is
# installed for real into temporary trees and used from there.
#
#   make install DESTDIR=T      the layout, SONAME, the exported symbols (the
#                               public headers' functions, nothing else), the
#                               installed sbx (--version, help, a copied sbx),
#                               `sbx demo` as installed, the installed image
#                               build context, `make uninstall`
#   pkg-config --cflags --libs sbx   a C program (turn.c) built against the
#                               installed tree that runs a turn through the ABI
#   luarocks make --tree=T      then plain lua5.4 on that tree only:
#                               require "sandbox" and a turn (rock_turn.lua)
#   bun pm pack; bun add TGZ    in a fresh project outside the checkout: the
#                               import by name, a turn, the image check
#                               (bun_turn.ts)
#   bun init -y; bun add TGZ; bunx tsc --noEmit   in another fresh project
#                               with bun init's default tsconfig: every
#                               "exports" entry and typed probes
#                               (bun_types.ts) check with no error, from the
#                               shipped dist/*.d.ts, never the package's src/
#
# usage: bash spec/install/install_test.sh   (from anywhere; `make all` first)
# Build and install steps run as the invoking user (root in CI: they write
# the checkout's build/ and bun/); everything that runs the engine runs as the
# service account $SBX_USER when invoked as root (the product refuses root),
# with the fixtures copied into the temporary tree it can read. Real-Docker
# cases (turns, image builds) need SANDBOX_DOCKER_TEST=1 and the image
# pi-roundtable-sandbox:local (make image); without it they are skipped.
# Prints "ok   <case>", "FAIL <case>: <why>", "skip <case>: <why>" and, last,
# "install: N passed, M failed, K skipped"; exits 1 if a case failed.
# Cleans up every tree, container and image tag it made.
set -uo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")/../../scripts" && pwd)/lib.sh"
cd "$SBX_ROOT" || exit 1
HERE="$SBX_ROOT/spec/install"
VERSION="$(cat VERSION)"
IMAGE="${SBX_TEST_IMAGE:-pi-roundtable-sandbox:local}"
DOCKER=0; [ "${SANDBOX_DOCKER_TEST:-}" = 1 ] && DOCKER=1
TEST_TAG="roundtable-install-test-image:$$"
CHECKOUT_TAG="roundtable-install-test-checkout:$$"   # this checkout's make image context, built apart
                                                     # (another worktree may rebuild $IMAGE meanwhile)

passed=0 failed=0 skipped=0
ok()   { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1: $2"; }
skip() { skipped=$((skipped + 1)); echo "skip $1: $2"; }
# check NAME COMMAND...: ok when COMMAND succeeds, else FAIL with its output's tail.
check() {
  local name="$1" out; shift
  if out="$("$@" 2>&1)"; then ok "$name"; else fail "$name" "$(printf '%s' "$out" | tail -n 15)"; fi
}
# docker_case NAME COMMAND...: check, or skip without SANDBOX_DOCKER_TEST=1.
docker_case() {
  if [ "$DOCKER" = 1 ]; then check "$@"; else skip "$1" "set SANDBOX_DOCKER_TEST=1 (real Docker)"; fi
}

# ---- the temporary trees -------------------------------------------------------
BASE="$(mktemp -d /tmp/sbx-install-XXXXXX)" || die "mktemp failed"
chmod 0755 "$BASE"
DEST="$BASE/dest"          # make install DESTDIR
ROCKS="$BASE/rocks"        # luarocks make --tree
PACK="$BASE/pack"          # bun pm pack --destination
PROJ="$BASE/project"       # the Bun user's project
TYPED="$BASE/typed"        # the TypeScript user's project (bun init -y)
FIX="$BASE/fixtures"       # the fixtures, readable by the service account
R="$BASE/r"                # the engine's roots and TMPDIR (the service account's, 0700)
mkdir -p "$PACK" "$FIX" "$PROJ" "$TYPED" "$R"
cp "$HERE"/turn.c "$HERE"/turn.conf.lua "$HERE"/rock_turn.lua "$HERE"/bun_turn.ts "$HERE"/bun_types.ts "$FIX/"
chmod -R a+rX "$FIX" "$PACK"
chmod 0700 "$R"
RUN=()
if is_root; then
  chown "$SBX_USER:" "$R" "$PROJ" "$TYPED"
  RUN=(runuser -u "$SBX_USER" -- env "HOME=$(getent passwd "$SBX_USER" | cut -d: -f6)")
fi
cleanup() {
  [ "$DOCKER" = 1 ] && docker image rm "$TEST_TAG" "$CHECKOUT_TAG" >/dev/null 2>&1
  rm -rf "$BASE"
  (cd "$SBX_ROOT/bun" && rm -rf native lua worker dist LICENSE) 2>/dev/null  # a pack that died before postpack
}
trap cleanup EXIT
# as_user CMD...: CMD as the service account (as root) or as this user, from /,
# with the private TMPDIR.
as_user() { (cd / && ${RUN[@]+"${RUN[@]}"} env "TMPDIR=$R" "$@"); }
root_dir() { as_user mktemp -d "$R/t-XXXXXX"; }   # 0700, the service account's

P="$DEST/usr/local"
# ---- make install DESTDIR ---------------------------------------------------------
if ! out="$(make --no-print-directory install DESTDIR="$DEST" 2>&1)"; then
  fail "make install DESTDIR" "$(printf '%s' "$out" | tail -n 20)"
  echo "install: $passed passed, $failed failed, $skipped skipped"
  exit 1
fi
chmod -R a+rX "$DEST"
ok "make install DESTDIR=T (PREFIX=/usr/local)"

layout() {
  local f missing=""
  for f in bin/sbx lib/libsbx.so.0 lib/libsbx.a lib/pkgconfig/sbx.pc lib/lua/5.4/sandbox/core.so \
    share/lua/5.4/sandbox/init.lua share/lua/5.4/sandbox/cli/init.lua share/lua/5.4/sandbox/runtime/layout.lua \
    share/pi-roundtable-sandbox/Dockerfile share/pi-roundtable-sandbox/sbx-worker \
    share/pi-roundtable-sandbox/build-image share/pi-roundtable-sandbox/image_lib.sh \
    share/pi-roundtable-sandbox/seccomp.json share/pi-roundtable-sandbox/lua/agent.lua \
    share/pi-roundtable-sandbox/pi/seccomp.json share/pi-roundtable-sandbox/precheck/seccomp.json \
    share/doc/pi-roundtable-sandbox/README.md share/doc/pi-roundtable-sandbox/LICENSE share/doc/pi-roundtable-sandbox/operations.md \
    share/doc/pi-roundtable-sandbox/threat-model.md share/doc/pi-roundtable-sandbox/operator-notes.md \
    share/doc/pi-roundtable-sandbox/roundtable-bot.service; do
    [ -f "$P/$f" ] || missing="$missing $f"
  done
  [ -z "$missing" ] || { echo "missing:$missing"; return 1; }
  [ "$(readlink "$P/lib/libsbx.so")" = libsbx.so.0 ] || { echo "lib/libsbx.so is not a link to libsbx.so.0"; return 1; }
  [ -x "$P/bin/sbx" ] && [ -x "$P/share/pi-roundtable-sandbox/build-image" ] || { echo "not executable"; return 1; }
  local headers; headers="$(cd "$P/include/sbx" && ls | tr '\n' ' ')"
  [ "$headers" = "sbx.h sbx_fetch.h sbx_ffi.h sbx_scrub.h " ] || { echo "include/sbx holds: $headers"; return 1; }
  local want have
  want="$(cd lua && find sandbox -name '*.lua' | LC_ALL=C sort)"
  have="$(cd "$P/share/lua/5.4" && find sandbox -type f | LC_ALL=C sort)"
  [ "$want" = "$have" ] || { echo "the installed Lua tree differs from lua/"; diff <(echo "$want") <(echo "$have") | head; return 1; }
  want="$(cd worker/lua && find . -name '*.lua' | LC_ALL=C sort)"
  have="$(cd "$P/share/pi-roundtable-sandbox/lua" && find . -type f | LC_ALL=C sort)"
  [ "$want" = "$have" ] || { echo "the image context's Lua differs from worker/lua/"; return 1; }
  cmp -s worker/Dockerfile "$P/share/pi-roundtable-sandbox/Dockerfile" || { echo "Dockerfile differs"; return 1; }
  cmp -s worker/seccomp.json "$P/share/pi-roundtable-sandbox/seccomp.json" || { echo "seccomp.json differs"; return 1; }
  cmp -s worker/pi/seccomp.json "$P/share/pi-roundtable-sandbox/pi/seccomp.json" || { echo "pi/seccomp.json differs"; return 1; }
  cmp -s worker/precheck/seccomp.json "$P/share/pi-roundtable-sandbox/precheck/seccomp.json" ||
    { echo "precheck/seccomp.json differs"; return 1; }
}
check "the installed layout: bin, lib (SONAME link), include/sbx (public headers only), pkgconfig, Lua modules, core.so, image context, docs" layout

# The functions the public headers declare (after the preprocessor).
declared() {
  local h
  for h in core/sbx.h core/sbx_ffi.h core/sbx_fetch.h core/sbx_scrub.h; do
    cc -E -P -D_GNU_SOURCE $(pkg-config --cflags libuv) -x c "$h" | grep -oE '\bsbx_[a-z0-9_]+[[:space:]]*\(' | tr -d ' ('
  done | LC_ALL=C sort -u
}
exports() {
  local so="$P/lib/libsbx.so.0" soname want have mapped
  soname="$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')"
  [ "$soname" = libsbx.so.0 ] || { echo "SONAME is '$soname'"; return 1; }
  want="$(declared)"
  have="$(nm -D --defined-only "$so" | awk '$2 != "A" { sub(/@.*/, "", $3); print $3 }' | LC_ALL=C sort -u)"
  mapped="$(grep -oE '^\s+sbx_[a-z0-9_]+;' core/libsbx.map | tr -d ' ;' | LC_ALL=C sort -u)"
  [ -n "$want" ] && [ "$want" = "$have" ] || { echo "exported vs declared:"; diff <(echo "$want") <(echo "$have"); return 1; }
  [ "$want" = "$mapped" ] || { echo "core/libsbx.map vs the headers:"; diff <(echo "$want") <(echo "$mapped"); return 1; }
  have="$(nm -D --defined-only "$P/lib/lua/5.4/sandbox/core.so" | awk '{ print $3 }')"
  [ "$have" = luaopen_sandbox_core ] || { echo "core.so exports: $have"; return 1; }
  # the whole dynamic section first: `readelf | grep -q` under pipefail can
  # fail on readelf's SIGPIPE and, negated, pass whatever core.so links
  have="$(readelf -d "$P/lib/lua/5.4/sandbox/core.so")" || { echo "readelf failed on core.so"; return 1; }
  ! grep -q 'NEEDED.*liblua' <<<"$have" || { echo "core.so links liblua"; return 1; }
}
check "libsbx.so.0: SONAME libsbx.so.0, exports exactly the public headers' functions (core/libsbx.map); core.so only luaopen_sandbox_core" exports

cli() {
  local out rc
  out="$(as_user "$P/bin/sbx" --version)" && [ "$out" = "sbx $VERSION" ] || { echo "--version: $out"; return 1; }
  out="$(as_user "$P/bin/sbx" version)" && [ "$out" = "sbx $VERSION" ] || { echo "version: $out"; return 1; }
  out="$(as_user "$P/bin/sbx" help demo)" && [ "${out%%$'\n'*}" = "usage: sbx demo [--image NAME] [--no-build] [--timeout MS]" ] ||
    { echo "help demo: $out"; return 1; }
  out="$(as_user "$P/bin/sbx" help no-such-command 2>&1)"; rc=$?
  [ "$rc" = 2 ] && [[ "$out" == *"unknown command 'no-such-command'"* ]] || { echo "help no-such-command: $rc $out"; return 1; }
}
check "the installed sbx finds its Lua tree from its prefix (no SBX_LUA_DIR): --version, version, help COMMAND" cli

copied() {
  local d="$BASE/copied" out rc
  mkdir -p "$d/bin" && cp "$P/bin/sbx" "$d/bin/sbx" && chmod -R a+rX "$d"
  # --version needs no Lua tree (the release is compiled in)
  out="$(as_user "$d/bin/sbx" --version 2>&1)" && [ "$out" = "sbx $VERSION" ] || { echo "--version: $out"; return 1; }
  out="$(as_user "$d/bin/sbx" help 2>&1)"; rc=$?
  [ "$rc" = 1 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && [[ "$out" == *SBX_LUA_DIR* ]] &&
    [[ "$out" == *"next to $d/bin/sbx "* ]] && [[ "$out" != *traceback* ]] || { echo "rc $rc: $out"; return 1; }
  out="$(as_user env SBX_LUA_DIR="$P/share/lua/5.4" "$d/bin/sbx" help version 2>&1)"
  [ "${out%%$'\n'*}" = "usage: sbx version (or sbx --version)" ] || { echo "with SBX_LUA_DIR: $out"; return 1; }
  out="$(as_user env SBX_LUA_DIR=/nonexistent "$d/bin/sbx" help 2>&1)"; rc=$?
  [ "$rc" = 1 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && [[ "$out" == *"SBX_LUA_DIR=/nonexistent"* ]] ||
    { echo "bad SBX_LUA_DIR: rc $rc: $out"; return 1; }
}
check "a copied sbx with no Lua tree: --version answers; anything else is one line naming itself and SBX_LUA_DIR, exit 1" copied

versions() {
  local pkg rock pc core
  pkg="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' bun/package.json)"
  rock="$(ls pi-roundtable-sandbox-*.rockspec)"
  pc="$(PKG_CONFIG_SYSROOT_DIR="$DEST" PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --modversion sbx)"
  [ "$pkg" = "$VERSION" ] || { echo "bun/package.json says $pkg"; return 1; }
  [ "$rock" = "pi-roundtable-sandbox-$VERSION-1.rockspec" ] || { echo "rockspec file $rock"; return 1; }
  grep -qx "version = \"$VERSION-1\"" "$rock" || { echo "$rock's version"; return 1; }
  [ "$pc" = "$VERSION" ] || { echo "sbx.pc says $pc"; return 1; }
}
check "one release everywhere: VERSION = sbx --version = sbx.pc = bun/package.json = the rockspec" versions

# The pi-roundtable range the package embeds into, as the operator notes say.
peer_range() {
  local want have
  want="$(sed -n 's/.*\*\*pi-roundtable `\(>=[^`]*\)`\*\*.*/\1/p' docs/operator-notes.md)"
  have="$(bun -e 'const p = require("./bun/package.json"); console.log(p.peerDependencies["pi-roundtable"] + (p.peerDependenciesMeta["pi-roundtable"].optional ? "" : " (not optional)"))')"
  [ -n "$want" ] && [ "$have" = "$want" ] || { echo "bun/package.json declares '$have', docs/operator-notes.md says '$want'"; return 1; }
}
check "the Bun package declares the pi-roundtable range docs/operator-notes.md gives, as an optional peer" peer_range

demo() {
  local out
  out="$(as_user "$P/bin/sbx" demo --no-build --image "$IMAGE" 2>&1)" || { echo "$out"; return 1; }
  [[ "$out" == *"turn 2 recalled turn 1's channel note"* && "$out" == *"no container left"* ]] || { echo "$out"; return 1; }
}
docker_case "the installed sbx demo runs two real sealed turns (as $SBX_USER, no variable set)" demo

demo_missing() {
  local out rc
  out="$(as_user "$P/bin/sbx" demo --no-build --image roundtable-install-test-absent:1 2>&1)"; rc=$?
  [ "$rc" = 1 ] && [[ "$out" == *"fix: SBX_IMAGE=roundtable-install-test-absent:1 $P/share/pi-roundtable-sandbox/build-image"* ]] ||
    { echo "rc $rc: $out"; return 1; }
}
docker_case "a missing image: the installed sbx names the installed build-image as the fix" demo_missing

build_image() {
  local out want have
  out="$(as_user env SBX_IMAGE="$TEST_TAG" "$P/share/pi-roundtable-sandbox/build-image" 2>&1)" || { echo "$out"; return 1; }
  out="$(env SBX_IMAGE="$CHECKOUT_TAG" SBX_IMAGE_CONTEXT="$BASE/checkout-ctx" bash "$SBX_ROOT/worker/image.sh" build 2>&1)" ||
    { echo "$out"; return 1; }
  want="$(docker image inspect --format '{{ index .Config.Labels "pi-roundtable-sandbox.context" }}' "$CHECKOUT_TAG")"
  have="$(docker image inspect --format '{{ index .Config.Labels "pi-roundtable-sandbox.context" }}' "$TEST_TAG")"
  [ -n "$have" ] && [ "$have" = "$want" ] || { echo "context $have, make image's $want"; return 1; }
}
docker_case "the installed build context builds the image make image builds (same context checksum)" build_image

# ---- pkg-config and a C program through the ABI --------------------------------
pc_flags() { PKG_CONFIG_SYSROOT_DIR="$DEST" PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --cflags --libs sbx; }
compile() {
  local flags; flags="$(pc_flags)" || return 1
  [[ "$flags" == *"-I$P/include/sbx"* && "$flags" == *"-L$P/lib"* && "$flags" == *-lsbx* ]] || { echo "flags: $flags"; return 1; }
  # shellcheck disable=SC2086
  cc -std=c11 -Wall -Wextra -Werror -o "$FIX/turn" "$FIX/turn.c" $flags && chmod a+rx "$FIX/turn"
}
check "pkg-config --cflags --libs sbx compiles a C host of the ABI against the installed tree" compile

# Each installed public header compiles alone in a strict C11 translation
# unit (no _GNU_SOURCE, -pedantic): a header must not pull <uv.h>, whose
# unix part needs POSIX types -std=c11 does not declare.
strict_headers() {
  local h src="$FIX/one_header.c"
  for h in sbx.h sbx_fetch.h sbx_ffi.h sbx_scrub.h; do
    printf '#include <%s>\nint main(void) { return 0; }\n' "$h" >"$src"
    cc -std=c11 -pedantic -Wall -Wextra -Werror -I"$P/include/sbx" -c -o "$FIX/one_header.o" "$src" ||
      { echo "$h does not compile alone with -std=c11 -pedantic"; return 1; }
  done
}
check "every installed public header compiles alone with -std=c11 -pedantic -Werror" strict_headers

c_turn() {
  local out root; root="$(root_dir)"
  [ -x "$FIX/turn" ] || { echo "turn.c was not built"; return 1; }
  # stdout is the program's; the engine's operator log (the turn's lines) is
  # on stderr, where it says the turn ended with reason ok
  out="$(as_user env LD_LIBRARY_PATH="$P/lib" "$FIX/turn" "$FIX/turn.conf.lua" \
    "{\"root\":\"$root\",\"image\":\"$IMAGE\"}" install:c "Please remember that the C host works" 2>"$root.err")" ||
    { echo "$out"; cat "$root.err"; return 1; }
  [[ "$out" == "version $VERSION abi 1"* && "$out" == *'"value":{'* && "$out" == *'"ok":true'* &&
     "$out" == *'"reason":"ok"'* && "$out" == *'the C host works'* ]] || { echo "$out"; cat "$root.err"; return 1; }
  grep -q ' info turn finished channel=install:c turn=[0-9a-f]* reason=ok' "$root.err" || { cat "$root.err"; return 1; }
}
docker_case "the C program runs a real sealed turn through the installed libsbx.so.0 (Lua tree found from the library)" c_turn

uninstall() {
  local left
  make --no-print-directory uninstall DESTDIR="$DEST" >/dev/null || return 1
  left="$(find "$DEST" -type f -o -type l)"
  [ -z "$left" ] || { echo "left behind: $left"; return 1; }
}
check "make uninstall DESTDIR=T removes every installed file" uninstall

# ---- luarocks make ------------------------------------------------------------------
if ! have luarocks; then
  fail "luarocks make" "luarocks is not installed (make deps)"
else
  rock_make() { luarocks --lua-version=5.4 make --tree="$ROCKS" && chmod -R a+rX "$ROCKS"; }
  check "luarocks --lua-version=5.4 make --tree=T builds and installs the rockspec" rock_make
  LUA_ENV=("LUA_PATH=$ROCKS/share/lua/5.4/?.lua;$ROCKS/share/lua/5.4/?/init.lua" "LUA_CPATH=$ROCKS/lib/lua/5.4/?.so")
  rock_require() {
    local out
    out="$(as_user env "${LUA_ENV[@]}" lua5.4 -e '
      local sandbox = require "sandbox"
      local core = require "sandbox.core"
      local ok, err = pcall(sandbox, { bogus = 1 })
      print(package.searchpath("sandbox.core", package.cpath), core.version, ok, err)' 2>&1)" || { echo "$out"; return 1; }
    [ "$out" = "$ROCKS/lib/lua/5.4/sandbox/core.so	$VERSION	false	unknown sandbox option: bogus" ] || { echo "$out"; return 1; }
  }
  check "plain lua5.4 on the rock tree only: require \"sandbox\" loads the rock's modules and sandbox.core" rock_require
  rock_turn() {
    local root; root="$(root_dir)"
    as_user env "${LUA_ENV[@]}" lua5.4 "$FIX/rock_turn.lua" "$root" "$IMAGE"
  }
  docker_case "plain lua5.4 on the rock tree runs a real sealed turn" rock_turn
fi

# ---- the Bun package: bun pm pack, bun add ---------------------------------------
if ! have bun; then
  fail "bun pm pack" "bun is not installed (make deps)"
else
  pack() { (cd bun && bun pm pack --destination "$PACK") && chmod -R a+rX "$PACK"; }
  check "bun pm pack (prepack fills native/, lua/, worker/, dist/, LICENSE; postpack removes them again)" pack
  TGZ="$PACK/pi-roundtable-sandbox-$VERSION.tgz"
  contents() {
    local list f missing=""
    list="$(tar tzf "$TGZ")" || return 1
    for f in package.json src/index.ts src/ffi.ts src/options.conf.lua native/libsbx.so lua/sandbox/init.lua \
      lua/sandbox/embed/init.lua lua/sandbox/runtime/layout.lua worker/Dockerfile worker/sbx-worker worker/build-image \
      worker/image_lib.sh worker/seccomp.json worker/pi/seccomp.json worker/precheck/seccomp.json \
      worker/lua/agent.lua scripts/build.ts dist/index.d.ts dist/types.d.ts LICENSE; do
      grep -qx "package/$f" <<<"$list" || missing="$missing $f"
    done
    [ -z "$missing" ] || { echo "the tarball lacks:$missing"; return 1; }
    [ "$(grep -c '^package/lua/.*\.lua$' <<<"$list")" = "$(find lua -name '*.lua' | wc -l)" ] || { echo "not every Lua module"; return 1; }
    [ "$(grep -c '^package/src/.*\.ts$' <<<"$list")" = "$(grep -c '^package/dist/.*\.d\.ts$' <<<"$list")" ] ||
      { echo "not one dist/*.d.ts per src/*.ts"; return 1; }
    tar xzOf "$TGZ" package/LICENSE | cmp -s - LICENSE || { echo "package/LICENSE is not the repository's LICENSE"; return 1; }
    [ ! -e bun/native ] && [ ! -e bun/lua ] && [ ! -e bun/worker ] && [ ! -e bun/dist ] && [ ! -e bun/LICENSE ] ||
      { echo "postpack left copies in bun/"; return 1; }
  }
  check "the packed tarball holds the TypeScript, its declarations (dist/), LICENSE, native/libsbx.so, the Lua tree and the worker build context" contents
  add() {
    local out
    cp "$FIX/bun_turn.ts" "$PROJ/bun_turn.ts" && chmod a+r "$PROJ/bun_turn.ts"
    printf '{ "name": "roundtable-install-test-consumer", "private": true }\n' >"$PROJ/package.json"
    is_root && chown "$SBX_USER:" "$PROJ/package.json" "$PROJ/bun_turn.ts"
    out="$(cd "$PROJ" && ${RUN[@]+"${RUN[@]}"} env "TMPDIR=$R" "BUN_INSTALL_CACHE_DIR=$R/bun-cache" bun add "$TGZ" 2>&1)" ||
      { echo "$out"; return 1; }
    # From another directory, by name: the engine runs (a host facility: no Docker).
    out="$(cd "$PROJ" && ${RUN[@]+"${RUN[@]}"} env "TMPDIR=$R" bun -e '
      import { isPublicAddress, libraryPath, disposeUtilityEngine } from "pi-roundtable-sandbox";
      console.log(libraryPath(), await isPublicAddress("93.184.216.34"), await isPublicAddress("127.0.0.1"));
      await disposeUtilityEngine();' 2>&1)" || { echo "$out"; return 1; }
    [ "$out" = "$PROJ/node_modules/pi-roundtable-sandbox/native/libsbx.so true false" ] || { echo "$out"; return 1; }
  }
  check "bun add <tarball> in a project outside the checkout: import by name loads the package's native/libsbx.so" add
  # The TypeScript user's project: bun init's own tsconfig and TypeScript (the
  # npm registry is the only network this needs, as for `make deps`).
  typed() {
    local out entries
    tsc_in() { (cd "$TYPED" && ${RUN[@]+"${RUN[@]}"} env "TMPDIR=$R" "BUN_INSTALL_CACHE_DIR=$R/bun-cache" "$@" 2>&1); }
    out="$(tsc_in timeout 300 bun init -y)" || { echo "bun init -y: $out" | tail -n 5; return 1; }
    [ -f "$TYPED/tsconfig.json" ] || { echo "bun init -y wrote no tsconfig.json"; return 1; }
    out="$(tsc_in timeout 300 bun add "$TGZ")" || { echo "bun add: $out"; return 1; }
    cp "$FIX/bun_types.ts" "$TYPED/bun_types.ts"
    # One import per "exports" entry of the package as installed.
    entries="$(tsc_in timeout 60 bun -e '
      const p = require("./node_modules/pi-roundtable-sandbox/package.json");
      Object.keys(p.exports).forEach((k, i) => console.log(`import * as entry${i} from "${p.name}${k.slice(1)}";`));')" ||
      { echo "reading the exports: $entries"; return 1; }
    [ "$(grep -c '^import \* as entry' <<<"$entries")" -ge 2 ] || { echo "exports read as: $entries"; return 1; }
    printf '%s\n' "$entries" >"$TYPED/entries.ts"
    is_root && chown "$SBX_USER:" "$TYPED/bun_types.ts" "$TYPED/entries.ts"
    # bun init's tsconfig as it is, never less strict than today's template.
    out="$(tsc_in timeout 300 bunx tsc --noEmit --strict --noUncheckedIndexedAccess --listFiles)" || { echo "bunx tsc --noEmit:"; grep -v '^/' <<<"$out" | head -n 20; return 1; }
    grep -q '/node_modules/pi-roundtable-sandbox/dist/index\.d\.ts$' <<<"$out" || { echo "tsc did not read dist/index.d.ts"; return 1; }
    ! grep '/node_modules/pi-roundtable-sandbox/src/' <<<"$out" || { echo "tsc read the package's sources, not its declarations"; return 1; }
  }
  check "bun init -y; bun add <tarball>; bunx tsc --noEmit: every exports entry type-checks from the shipped dist/*.d.ts" typed
  bun_turn() {
    local root; root="$(root_dir)"
    (cd "$PROJ" && ${RUN[@]+"${RUN[@]}"} env "TMPDIR=$R" bun bun_turn.ts "$root" "$IMAGE")
  }
  docker_case "the added package runs a real sealed turn; a missing image refuses sandbox() naming the package's build-image" bun_turn
fi

echo "install: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
