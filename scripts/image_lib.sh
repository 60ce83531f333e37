# image_lib.sh: what the FROM-scratch image scripts share (worker/image.sh,
# worker/precheck/image.sh, worker/pi/image.sh). Sourced, not run.
#
#   image_build CTX IMAGE   fixes every timestamp under CTX, sums the context
#                           (every path with its type and mode, then every
#                           file's bytes) and builds IMAGE from CTX unless it
#                           already carries the label
#                           pi-roundtable-sandbox.context=<that sum>
#   image_size IMAGE        the image's size in bytes
#   image_npm_bun           prints the Linux executable the npm registry's
#                           `bun` package installed (`make deps`), or fails
#   image_copy_libs FS ELF...  copies the dynamic loader and every library
#                           ldd lists for each ELF file to the same absolute
#                           path under FS (links followed; a static file needs
#                           none); a library ldd reports "not found" fails
#                           with its name
# Modes are the caller's to normalise first (they are part of the sum).

IMAGE_LABEL="pi-roundtable-sandbox.context"

image_build() {
  local ctx="$1" image="$2" sum have out
  find "$ctx" -exec touch -h -d @0 {} +
  sum="$(cd "$ctx" && {
    find . -printf '%y %m %p\n' | LC_ALL=C sort
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-64)"
  have="$(docker image inspect --format "{{ index .Config.Labels \"$IMAGE_LABEL\" }}" "$image" 2>/dev/null || true)"
  if [ "$have" = "$sum" ]; then
    echo "image: $image is up to date (context $sum)"
    return 0
  fi
  echo "image: building $image (context $sum)"
  if ! out="$(DOCKER_BUILDKIT=0 docker build --quiet --pull=false --label "$IMAGE_LABEL=$sum" \
                -t "$image" "$ctx" 2>&1)"; then
    printf '%s\n' "$out" >&2
    return 1
  fi
}

image_size() {
  docker image inspect --format '{{ .Size }}' "$1"
}

# The npm package's executable: <package>/bin/bun.exe of a package named bun,
# found through npm's global root or through `bun` on PATH (npm's link into
# the package). $SBX_BUN overrides both (it must be that file too).
image_npm_bun() {
  local exe pkg
  if [ -n "${SBX_BUN:-}" ]; then printf '%s\n' "$SBX_BUN"; return 0; fi
  for pkg in \
      "$(command -v npm >/dev/null 2>&1 && npm root -g 2>/dev/null)/bun" \
      "$(exe="$(readlink -f "$(command -v bun 2>/dev/null || echo /nonexistent)" 2>/dev/null)"; dirname "$(dirname "$exe")")"; do
    if [ -f "$pkg/package.json" ] && [ -x "$pkg/bin/bun.exe" ] && grep -q '"name": *"bun"' "$pkg/package.json"; then
      printf '%s\n' "$pkg/bin/bun.exe"
      return 0
    fi
  done
  echo "image: the npm registry's bun package is not installed (run \`make deps\`: npm install -g bun)" >&2
  return 1
}

image_copy_libs() {
  local fs="$1" f line lib out; shift
  for f in "$@"; do
    out="$(ldd "$f" 2>&1 || true)"        # a static file: "not a dynamic executable"
    while IFS= read -r line; do
      line="${line#"${line%%[![:space:]]*}"}"
      case "$line" in
        *"not found"*)
          echo "image: library missing for $f: ${line%% =>*} (install the Debian package that provides it)" >&2
          return 1 ;;
        *"=> /"*) lib="${line#*=> }"; lib="${lib%% (*}" ;;
        /*) lib="${line%% (*}" ;;
        *) continue ;;
      esac
      [ -e "$fs$lib" ] && continue
      mkdir -p "$fs$(dirname "$lib")"
      cp -L "$lib" "$fs$lib"
    done <<<"$out"
  done
}
