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
#                             $SBX_BUN, which must be that file too)
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

BUN="$(image_npm_bun)" || exit 1
[ "$(head -c 4 "$BUN" | od -An -tx1 | tr -d ' \n')" = "7f454c46" ] || fail "$BUN is not an ELF executable"
# ldd's whole answer first: under pipefail, `ldd | grep -q` fails whenever grep
# stops reading before ldd has written everything (SIGPIPE), as it did in CI.
BUN_LDD="$(ldd "$BUN" 2>/dev/null || true)"
grep -q '=> /\|^\s*/' <<<"$BUN_LDD" || fail "ldd lists no loader for $BUN (a static bun is not the npm package's)"

rm -rf "$CTX"
mkdir -p "$FS/usr/local/bin" "$FS/app" "$FS/broker" "$FS/workspace" "$FS/tmp"
cp "$SRC/Dockerfile" "$CTX/Dockerfile"
cp "$BUN" "$FS/usr/local/bin/bun"
image_copy_libs "$FS" "$BUN" || exit 1
cp "$SRC/precheck-main.mjs" "$FS/app/precheck-main.mjs"
cp "$SRC/bunfig.toml" "$FS/app/bunfig.toml"

find "$FS" -type d -exec chmod 0755 {} +
find "$FS" -type f -exec chmod 0644 {} +
chmod 0755 "$FS/usr/local/bin/bun"
LIBS=()
while IFS= read -r -d '' lib; do LIBS+=("$lib"); chmod 0755 "$lib"; done \
  < <(find "$FS" -type f ! -path "$FS/app/*" ! -path "$FS/usr/local/bin/bun" -print0)
chmod 1777 "$FS/tmp"

image_build "$CTX" "$IMAGE"
size="$(image_size "$IMAGE")"
echo "image: $IMAGE size $size bytes ($((size / 1048576)) MiB); bun $(stat -c %s "$BUN") bytes from $BUN; ${#LIBS[@]} loader/libraries"
