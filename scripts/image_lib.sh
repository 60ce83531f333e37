# image_lib.sh: what the two FROM-scratch image scripts share (worker/image.sh,
# worker/precheck/image.sh). Sourced, not run.
#
#   image_build CTX IMAGE   fixes every timestamp under CTX, sums the context
#                           (every path with its type and mode, then every
#                           file's bytes) and builds IMAGE from CTX unless it
#                           already carries the label
#                           pi-roundtable-sandbox.context=<that sum>
#   image_size IMAGE        the image's size in bytes
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
