#!/usr/bin/env bash
# worker/image.sh: builds the sealed worker image pi-roundtable-sandbox:local
# FROM scratch (worker/Dockerfile), as root or as a docker-group user. One
# script for two layouts:
#   image.sh B          `make image` in a checkout: the binary from
#                       B/worker/sbx-worker, the Lua from worker/lua/, the
#                       context assembled in B/image/
#   build-image         an installed build context: this script beside
#                       Dockerfile, sbx-worker, lua/ and image_lib.sh
#                       (scripts/image_lib.sh) (`make install`:
#                       PREFIX/share/pi-roundtable-sandbox/build-image; the
#                       Bun package: worker/build-image); the context is
#                       assembled in a temporary directory, removed after
# SBX_IMAGE=NAME builds another tag; SBX_IMAGE_CONTEXT=DIR assembles there.
#
# rootfs/ gets: /app/worker/sbx-worker (the stripped static binary),
# /app/worker/lua/ (every worker/lua/**/*.lua, layout kept), /usr/share/
# zoneinfo/ (the build machine's zone files that start with TZif, without
# the posix/ and right/ duplicates and the host's own localtime link, symlinks resolved so no link leaves the
# tree), and empty /broker, /workspace, /tmp. Modes are normalised and
# timestamps fixed, so the context checksum depends only on content (the
# same in both layouts).
#
# The context also carries seccomp.json (worker/seccomp.json, beside the
# Dockerfile, not in rootfs/): the profile every sealed container of this
# image runs under (shared/spec/hardening.md 1), shipped with it.
#
# Skips the build when the image already carries the label
# pi-roundtable-sandbox.context=<sha256 of the context>; prints the size.
set -euo pipefail
IMAGE="${SBX_IMAGE:-pi-roundtable-sandbox:local}"   # `make image SBX_IMAGE=...` for another tag
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ZONES=/usr/share/zoneinfo

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,/^#$/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit 0
fi
if [ -x "$HERE/sbx-worker" ] && [ -f "$HERE/Dockerfile" ]; then
  . "$HERE/image_lib.sh"
  WORKER_BIN="$HERE/sbx-worker" WORKER_LUA="$HERE/lua" DOCKERFILE="$HERE/Dockerfile" SECCOMP="$HERE/seccomp.json"
  if [ -n "${SBX_IMAGE_CONTEXT:-}" ]; then
    CTX="$SBX_IMAGE_CONTEXT"
  else
    CTX="$(mktemp -d "${TMPDIR:-/tmp}/sbx-image-XXXXXX")"
    trap 'rm -rf "$CTX"' EXIT
  fi
else
  B="${1:-build}"
  cd "$HERE/.."
  . scripts/image_lib.sh
  WORKER_BIN="$B/worker/sbx-worker" WORKER_LUA="worker/lua" DOCKERFILE="worker/Dockerfile" SECCOMP="worker/seccomp.json"
  CTX="${SBX_IMAGE_CONTEXT:-$B/image}"   # a writable dir when build/ is not ours
  [ -x "$WORKER_BIN" ] || { echo "image: $WORKER_BIN missing (make worker)" >&2; exit 1; }
fi
FS="$CTX/rootfs"
[ -f "$ZONES/UTC" ] || { echo "image: $ZONES/UTC missing (apt-get install tzdata)" >&2; exit 1; }

rm -rf "$CTX"
mkdir -p "$FS/app/worker/lua" "$FS/usr/share/zoneinfo" "$FS/broker" "$FS/workspace" "$FS/tmp"
cp "$DOCKERFILE" "$CTX/Dockerfile"
cp "$SECCOMP" "$CTX/seccomp.json"
cp "$WORKER_BIN" "$FS/app/worker/sbx-worker"

# The worker's Lua, layout kept (worker/lua/a/b.lua -> /app/worker/lua/a/b.lua).
if [ -d "$WORKER_LUA" ]; then
  (cd "$WORKER_LUA" && find . -type f -name '*.lua' -print0) |
    while IFS= read -r -d '' f; do
      mkdir -p "$FS/app/worker/lua/$(dirname "$f")"
      cp "$WORKER_LUA/$f" "$FS/app/worker/lua/$f"
    done
fi

# Zone files: no posix/ or right/ trees, no host localtime, links
# dereferenced; then anything that is not TZif (tables, tzdata.zi) goes.
tar -C "$ZONES" -chf - --exclude=./posix --exclude=./right --exclude=./localtime . |
  tar -C "$FS/usr/share/zoneinfo" -xf -
while IFS= read -r -d '' f; do
  magic=""
  IFS= read -r -N 4 magic <"$f" || true
  [ "$magic" = "TZif" ] || rm -f "$f"
done < <(find "$FS/usr/share/zoneinfo" -type f -print0)

find "$FS" -type d -exec chmod 0755 {} +
find "$FS" -type f -exec chmod 0644 {} +
chmod 0644 "$CTX/seccomp.json"
chmod 0755 "$FS/app/worker/sbx-worker"
chmod 1777 "$FS/tmp"
image_build "$CTX" "$IMAGE"
size="$(image_size "$IMAGE")"
echo "image: $IMAGE size $size bytes ($((size / 1024)) KiB); binary $(stat -c %s "$WORKER_BIN") bytes; zone files $(find "$FS/usr/share/zoneinfo" -type f | wc -l)"
