#!/usr/bin/env bash
# worker/precheck/image.sh B: the precheck half of `make image`. Assembles the
# build context of pi-roundtable-sandbox:precheck in B/precheck-image/ and
# builds it FROM scratch (worker/precheck/Dockerfile; shared/spec/precheck.md
# 6.2), as root or as a docker-group user.
#
# rootfs/ gets exactly:
#   /usr/local/bin/bun        the Linux executable the npm registry's `bun`
#                             package installed for this machine's architecture
#                             (npm's global bun package, bin/bun.exe; or
#                             $SBX_PRECHECK_BUN, which must be that file too)
#   the dynamic loader and every library `ldd` lists for it, copied (links
#                             followed) to the same absolute paths; a library
#                             ldd reports "not found" fails the build
#   /app/precheck-main.mjs    the entry script (plain JavaScript, no imports
#                             beyond Bun's built-in modules)
#   /app/bunfig.toml          package auto-install disabled
#   /broker /workspace /tmp   empty mount points
# No shell, no node_modules, no credential. Modes are normalised and
# timestamps fixed; the build is skipped when the image's context label
# already matches (scripts/image_lib.sh). Prints the image size.
set -euo pipefail
B="${1:-build}"
IMAGE="${SBX_PRECHECK_IMAGE:-pi-roundtable-sandbox:precheck}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
. scripts/image_lib.sh
CTX="${SBX_PRECHECK_IMAGE_CONTEXT:-$B/precheck-image}"
FS="$CTX/rootfs"
SRC=worker/precheck

fail() { echo "precheck image: $*" >&2; exit 1; }

# The npm package's executable: <package>/bin/bun.exe of a package named bun.
bun_from_package() {
  local pkg="$1"
  [ -f "$pkg/package.json" ] && [ -x "$pkg/bin/bun.exe" ] || return 1
  grep -q '"name": *"bun"' "$pkg/package.json" || return 1
  printf '%s\n' "$pkg/bin/bun.exe"
}

find_bun() {
  local root exe
  if [ -n "${SBX_PRECHECK_BUN:-}" ]; then printf '%s\n' "$SBX_PRECHECK_BUN"; return; fi
  if command -v npm >/dev/null 2>&1 && root="$(npm root -g 2>/dev/null)" && bun_from_package "$root/bun"; then
    return
  fi
  # `bun` on PATH is npm's link into the package (…/node_modules/bun/bin/bun.exe).
  exe="$(readlink -f "$(command -v bun 2>/dev/null || echo /nonexistent)" 2>/dev/null || true)"
  [ -n "$exe" ] && bun_from_package "$(dirname "$(dirname "$exe")")" && return
  fail "the npm registry's bun package is not installed (run \`make deps\`: npm install -g bun)"
}

BUN="$(find_bun)"
[ -x "$BUN" ] || fail "$BUN is not an executable"
[ "$(head -c 4 "$BUN" | od -An -tx1 | tr -d ' \n')" = "7f454c46" ] || fail "$BUN is not an ELF executable"

# Libraries: "name => /path (0x...)", "/path (0x...)" (the loader), or a
# vDSO line without a path. Anything "not found" fails the build.
LDD_OUT="$(ldd "$BUN")" || fail "ldd $BUN failed"
if grep -q 'not found' <<<"$LDD_OUT"; then
  printf '%s\n' "$LDD_OUT" >&2
  fail "ldd reports a missing library for $BUN"
fi
LIBS=()
while read -r line; do
  path=""
  case "$line" in
    *"=> /"*) path="${line#*=> }"; path="${path%% (*}" ;;
    /*) path="${line%% (*}" ;;
  esac
  [ -n "$path" ] && LIBS+=("$path")
done <<<"$LDD_OUT"
[ "${#LIBS[@]}" -gt 0 ] || fail "ldd lists no loader for $BUN (a static bun is not the npm package's)"

rm -rf "$CTX"
mkdir -p "$FS/usr/local/bin" "$FS/app" "$FS/broker" "$FS/workspace" "$FS/tmp"
cp "$SRC/Dockerfile" "$CTX/Dockerfile"
cp "$BUN" "$FS/usr/local/bin/bun"
for lib in "${LIBS[@]}"; do
  [ -f "$lib" ] || fail "ldd listed $lib, which is not a file"
  mkdir -p "$FS$(dirname "$lib")"
  cp -L "$lib" "$FS$lib"
done
cp "$SRC/precheck-main.mjs" "$FS/app/precheck-main.mjs"
cp "$SRC/bunfig.toml" "$FS/app/bunfig.toml"

find "$FS" -type d -exec chmod 0755 {} +
find "$FS" -type f -exec chmod 0644 {} +
chmod 0755 "$FS/usr/local/bin/bun"
for lib in "${LIBS[@]}"; do chmod 0755 "$FS$lib"; done
chmod 1777 "$FS/tmp"

image_build "$CTX" "$IMAGE"
size="$(image_size "$IMAGE")"
echo "image: $IMAGE size $size bytes ($((size / 1048576)) MiB); bun $(stat -c %s "$BUN") bytes from $BUN; ${#LIBS[@]} loader/libraries"
