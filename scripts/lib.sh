# lib.sh: small helpers shared by scripts/deps.sh, check.sh and fuzz.sh.
# Sourced, not run. Plain output (no colours): it is read in CI logs.

# The repository root (the folder holding this scripts/ folder).
SBX_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The non-root service account that tests, the demo and the broker run as.
SBX_USER="${SBX_USER:-sbx}"

# Where Debian puts multiarch libraries on this machine.
SBX_LIBDIR="/usr/lib/x86_64-linux-gnu"

is_root() { [ "$(id -u)" -eq 0 ]; }

have() { command -v "$1" >/dev/null 2>&1; }

# say TAG MESSAGE...: one line, prefixed, on stdout.
say() {
  local tag="$1"; shift
  printf '%s: %s\n' "$tag" "$*"
}

die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

# Seconds since the epoch, with fraction (for timings).
now_s() { date +%s.%N; }

# elapsed START: seconds since START (from now_s), one decimal.
elapsed() { awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }'; }
