#!/usr/bin/env bash
# worker/pi/image.sh B: `make image-pi`. Builds the two rich-mode images
# (spec/rich-mode.md 17.1) FROM scratch, as root or as a docker-group user:
#
#   deps    $PI_DEPS_IMAGE (default pi-roundtable-sandbox:pi-deps), context
#           B/pi-deps/: the bun executable `make deps` installed from the npm
#           registry, its dynamic loader and every library ldd lists for it and
#           for each ELF file under node_modules, the zone files, and
#           /app/node_modules installed by bun from worker/pi/package.json and
#           bun.lock (--frozen-lockfile: the lockfile is the pin).
#   runtime $PI_IMAGE (default pi-roundtable-sandbox:pi), context B/pi/:
#           the worker scripts (pi-main.js, lib/) under /app/worker/, the release
#           tree $PI_RELEASE (default worker/pi/release: assets, persona,
#           shared, worker incl. content.ts) under /app/, and empty /tmp,
#           /workspace, /run/sandbox; built --build-arg DEPS_IMAGE=<deps image id>.
#
# Each image carries a label with the sha256 of what it was built from (the
# deps image: manifest, lockfile, bun, Dockerfile and this script, so an
# unchanged pin skips the install; the runtime image: its whole context plus
# the deps image id) and is not rebuilt when the label matches. A library ldd
# cannot find, or a missing bun, stops the build with the name of what is
# missing. Prints both sizes.
set -euo pipefail
B="${1:-build}"
DEPS_IMAGE="${PI_DEPS_IMAGE:-pi-roundtable-sandbox:pi-deps}"
IMAGE="${PI_IMAGE:-pi-roundtable-sandbox:pi}"
LABEL="pi-roundtable-sandbox.context"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
. scripts/image_lib.sh          # image_npm_bun, image_copy_libs
RELEASE="${PI_RELEASE:-worker/pi/release}"
ZONES=/usr/share/zoneinfo

die() { echo "image-pi: $*" >&2; exit 1; }
label_of() { docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true; }
build() { # build TAG CONTEXT SUM [docker build args...]
  local tag="$1" ctx="$2" sum="$3" out; shift 3
  echo "image-pi: building $tag (context $sum)"
  if ! out="$(DOCKER_BUILDKIT=0 docker build --quiet --pull=false --label "$LABEL=$sum" -t "$tag" "$@" "$ctx" 2>&1)"; then
    printf '%s\n' "$out" >&2; exit 1
  fi
}
sum_tree() { (cd "$1" && { find . -printf '%y %m %p\n' | LC_ALL=C sort; find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-64); }

# ---- dependency image -----------------------------------------------------------
BUN="$(image_npm_bun)" || die "bun not found (make deps installs it from the npm registry)"
[ -f worker/pi/bun.lock ] || die "worker/pi/bun.lock missing"
DEPS_SUM="$({ sha256sum worker/pi/package.json worker/pi/bun.lock worker/Dockerfile.deps.pi worker/pi/image.sh | cut -c1-64; sha256sum "$BUN" | cut -c1-64; } | sha256sum | cut -c1-64)"
if [ "$(label_of "$DEPS_IMAGE")" = "$DEPS_SUM" ]; then
  echo "image-pi: $DEPS_IMAGE is up to date (context $DEPS_SUM)"
else
  CTX="$B/pi-deps"
  FS="$CTX/rootfs"
  rm -rf "$CTX"
  mkdir -p "$FS/usr/local/bin" "$FS/app" "$FS/usr/share/zoneinfo" "$CTX/install"
  cp worker/pi/package.json worker/pi/bun.lock "$CTX/install/"
  echo "image-pi: bun install --frozen-lockfile --production ($(bun --version))"
  if ! out="$(cd "$CTX/install" && HOME="${HOME:-$PWD}" bun install --frozen-lockfile --production --no-progress 2>&1)"; then
    printf '%s\n' "$out" >&2; die "bun install failed"
  fi
  mv "$CTX/install/node_modules" "$FS/app/node_modules"
  cp "$BUN" "$FS/usr/local/bin/bun"
  mapfile -d '' elves < <(find "$FS/app/node_modules" -type f \( -name '*.node' -o -perm -u+x \) -print0)
  targets=("$BUN")
  for f in "${elves[@]}"; do
    magic="$(head -c 4 "$f" | od -An -c | tr -d ' ')"
    [ "$magic" = '177ELF' ] || continue
    [ "$(od -An -tx1 -j18 -N2 "$f" | tr -d ' ')" = 3e00 ] || continue   # x86-64 only: other architectures' prebuilds never load
    targets+=("$f")
  done
  image_copy_libs "$FS" "${targets[@]}" || die "a library is missing (see above)"
  tar -C "$ZONES" -chf - --exclude=./posix --exclude=./right --exclude=./localtime . | tar -C "$FS/usr/share/zoneinfo" -xf -
  cp worker/Dockerfile.deps.pi "$CTX/Dockerfile"
  rm -rf "$CTX/install"
  find "$FS" -exec touch -h -d @0 {} +
  build "$DEPS_IMAGE" "$CTX" "$DEPS_SUM"
  echo "image-pi: $DEPS_IMAGE holds bun and the libraries of ${#targets[@]} ELF files"
fi
DEPS_ID="$(docker image inspect --format '{{ .Id }}' "$DEPS_IMAGE")"

# ---- runtime image --------------------------------------------------------------
[ -f "$RELEASE/worker/content.ts" ] || die "$RELEASE/worker/content.ts missing (PI_RELEASE names the release tree)"
CTX="$B/pi"
FS="$CTX/rootfs"
rm -rf "$CTX"
mkdir -p "$FS/app/worker" "$FS/tmp" "$FS/workspace" "$FS/run/sandbox"
for d in assets persona shared worker; do
  [ -d "$RELEASE/$d" ] || die "$RELEASE/$d missing (a release tree has assets, persona, shared and worker)"
  mkdir -p "$FS/app/$d"
  tar -C "$RELEASE/$d" -chf - --exclude=.keep . | tar -C "$FS/app/$d" -xf -
done
cp worker/pi/pi-main.js "$FS/app/worker/pi-main.js"
(cd worker/pi && find lib -type f -name '*.js' -print0) | while IFS= read -r -d '' f; do
  mkdir -p "$FS/app/worker/$(dirname "$f")"; cp "worker/pi/$f" "$FS/app/worker/$f"
done
cp worker/Dockerfile.pi "$CTX/Dockerfile"
find "$FS" -type d -exec chmod 0755 {} +
find "$FS" -type f -exec chmod 0644 {} +
chmod 1777 "$FS/tmp"
find "$CTX" -exec touch -h -d @0 {} +
SUM="$({ sum_tree "$CTX"; echo "$DEPS_ID"; } | sha256sum | cut -c1-64)"
if [ "$(label_of "$IMAGE")" = "$SUM" ]; then
  echo "image-pi: $IMAGE is up to date (context $SUM)"
else
  build "$IMAGE" "$CTX" "$SUM" --build-arg "DEPS_IMAGE=$DEPS_ID"
fi
for t in "$DEPS_IMAGE" "$IMAGE"; do
  size="$(docker image inspect --format '{{ .Size }}' "$t")"
  echo "image-pi: $t size $size bytes ($((size / 1024 / 1024)) MiB)"
done
