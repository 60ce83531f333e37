#!/usr/bin/env bash
# worker/image.sh B: `make image`. Assembles the build context of the worker
# image in B/image/ from build outputs and builds pi-roundtable-sandbox:local
# FROM scratch (worker/Dockerfile), as root or as a docker-group user.
#
# rootfs/ gets: /app/worker/sbx-worker (the stripped static binary),
# /app/worker/lua/ (every worker/lua/**/*.lua, layout kept), /usr/share/
# zoneinfo/ (the build machine's zone files that start with TZif, without
# the posix/ and right/ duplicates and the host's own localtime link, symlinks resolved so no link leaves the
# tree), and empty /broker, /workspace, /tmp. Modes are normalised and
# timestamps fixed, so the context checksum depends only on content.
#
# Skips the build when the image already carries the label
# pi-roundtable-sandbox.context=<sha256 of the context>; prints the size.
set -euo pipefail
B="${1:-build}"
IMAGE="${SBX_IMAGE:-pi-roundtable-sandbox:local}"   # `make image SBX_IMAGE=...` for another tag
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/image_lib.sh
CTX="${SBX_IMAGE_CONTEXT:-$B/image}"   # a writable dir when build/ is not ours
FS="$CTX/rootfs"
ZONES=/usr/share/zoneinfo

[ -x "$B/worker/sbx-worker" ] || { echo "image: $B/worker/sbx-worker missing (make worker)" >&2; exit 1; }
[ -f "$ZONES/UTC" ] || { echo "image: $ZONES/UTC missing (apt-get install tzdata)" >&2; exit 1; }

rm -rf "$CTX"
mkdir -p "$FS/app/worker/lua" "$FS/usr/share/zoneinfo" "$FS/broker" "$FS/workspace" "$FS/tmp"
cp worker/Dockerfile "$CTX/Dockerfile"
cp "$B/worker/sbx-worker" "$FS/app/worker/sbx-worker"

# The worker's Lua, layout kept (worker/lua/a/b.lua -> /app/worker/lua/a/b.lua).
if [ -d worker/lua ]; then
  (cd worker/lua && find . -type f -name '*.lua' -print0) |
    while IFS= read -r -d '' f; do
      mkdir -p "$FS/app/worker/lua/$(dirname "$f")"
      cp "worker/lua/$f" "$FS/app/worker/lua/$f"
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
chmod 0755 "$FS/app/worker/sbx-worker"
chmod 1777 "$FS/tmp"
image_build "$CTX" "$IMAGE"
size="$(image_size "$IMAGE")"
echo "image: $IMAGE size $size bytes ($((size / 1024)) KiB); binary $(stat -c %s "$B/worker/sbx-worker") bytes; zone files $(find "$FS/usr/share/zoneinfo" -type f | wc -l)"
