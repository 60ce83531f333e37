#!/usr/bin/env bash
# deps.sh: bootstraps this machine for building and testing (run by `make deps`).
#
# Checks every dependency and prints one line each: `ok`, `installed`, or
# `missing: <the fix>`. As root it installs what is missing: Debian packages
# with apt-get (one `apt-get update` first, only when something is missing),
# Bun from the npm registry, the MCP SDK for the spec fixtures (`npm ci`), the
# Bun package's dev tools (`bun install` in bun/: TypeScript, which makes the
# declarations `bun pm pack` ships), the
# Docker daemon (started in the background when `docker info` does not answer;
# machines without systemd are expected), and the `sbx` service account in the
# `docker` group that the tests run as. As another user it installs nothing it
# would need root for: it prints the exact command and fails.
#
# Idempotent and quick (about a second) when everything is present.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$SBX_ROOT" || exit 1

export DEBIAN_FRONTEND=noninteractive
APT_INSTALL="apt-get install -y -q --no-install-recommends"
FIXTURES="spec/fixtures"
DOCKERD_LOG="/var/log/sbx-dockerd.log"
failed=0

line() { printf 'deps: %-26s %s\n' "$1" "$2"; }

# ---- Debian packages --------------------------------------------------------
# name | package(s) that fix it | check (a shell function below)
chk_build()      { have cc && have gcc && have make && have ar; }
chk_pkgconfig()  { have pkg-config; }
chk_lua_dev()    { pkg-config --exists lua5.4 && [ -f "$SBX_LIBDIR/liblua5.4.a" ]; }
chk_lua()        { have lua5.4; }
chk_libuv()      { pkg-config --exists libuv; }
chk_libcurl()    { pkg-config --exists libcurl; }
chk_libcrypto()  { pkg-config --exists libcrypto; }
chk_decoders()   { pkg-config --exists zlib libbrotlidec; }
chk_utf8proc()   { pkg-config --exists libutf8proc; }
chk_httpparser() { [ -f /usr/include/http_parser.h ] && [ -e "$SBX_LIBDIR/libhttp_parser.so" ]; }
chk_cjson()      {
  [ -f "$SBX_LIBDIR/liblua5.4-cjson.a" ] && have lua5.4 &&
    lua5.4 -e 'require "cjson"' >/dev/null 2>&1
}
chk_busted()     {
  [ -f /usr/bin/busted ] && have lua5.4 && lua5.4 /usr/bin/busted --version >/dev/null 2>&1
}
chk_luarocks()   { have luarocks && luarocks --lua-version=5.4 config lua_version >/dev/null 2>&1; }
chk_clang()      { have clang; }
chk_fuzzer_rt()  {
  have clang && [ -f "$(clang --print-runtime-dir 2>/dev/null)/libclang_rt.fuzzer-x86_64.a" ]
}
chk_gcc_asan()   {
  have gcc && [ -e "$(gcc -print-file-name=libasan.so)" ] && [ -e "$(gcc -print-file-name=libubsan.so)" ]
}
chk_docker_pkg() { have docker && have dockerd; }
chk_openssl()    { have openssl; }
chk_cacerts()    { [ -f /etc/ssl/certs/ca-certificates.crt ]; }
chk_tzdata()     { [ -f /usr/share/zoneinfo/UTC ] && [ -f /usr/share/zoneinfo/Asia/Taipei ]; }
chk_prometheus() { have prometheus && have promtool; }
# PostgreSQL server binaries (the adapter's specs start a throwaway cluster) and
# Lua 5.4's DBI driver for it (lua/sandbox/adapters/postgres.lua).
chk_postgres()   { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && have psql; }
chk_luadbi_pg()  { have lua5.4 && lua5.4 -e 'require "DBI"; require "dbd.postgresql"' >/dev/null 2>&1; }

APT_CHECKS=(
  "cc, make (build-essential)|build-essential|chk_build"
  "pkg-config|pkg-config|chk_pkgconfig"
  "lua5.4 headers + static lib|liblua5.4-dev|chk_lua_dev"
  "lua5.4 interpreter|lua5.4|chk_lua"
  "libuv|libuv1-dev|chk_libuv"
  "libcurl|libcurl4-openssl-dev|chk_libcurl"
  "libcrypto (OpenSSL)|libssl-dev|chk_libcrypto"
  "zlib + Brotli decoder (safe fetch)|zlib1g-dev libbrotli-dev|chk_decoders"
  "http_parser|libhttp-parser-dev|chk_httpparser"
  "utf8proc (NFC, rich attachments)|libutf8proc-dev|chk_utf8proc"
  "lua-cjson (5.4)|lua-cjson-dev|chk_cjson"
  "busted (lua5.4)|lua-busted|chk_busted"
  "luarocks (the rockspec check)|luarocks|chk_luarocks"
  "clang|clang|chk_clang"
  "clang fuzzer runtime|libclang-rt-14-dev|chk_fuzzer_rt"
  "gcc asan/ubsan runtime|build-essential|chk_gcc_asan"
  "docker + dockerd|docker.io cgroupfs-mount|chk_docker_pkg"
  "openssl|openssl|chk_openssl"
  "ca-certificates|ca-certificates|chk_cacerts"
  "tz database (worker image)|tzdata|chk_tzdata"
  "prometheus + promtool (metrics specs)|prometheus|chk_prometheus"
  "postgresql (adapter specs)|postgresql|chk_postgres"
  "lua-dbi-postgresql (5.4)|lua-dbi-postgresql|chk_luadbi_pg"
)

# Node.js and npm: preinstalled from nodesource on these machines; Debian's
# npm conflicts with that build, so Debian's are installed only if both are absent.
node_state() {
  if have node && have npm; then echo ok
  elif ! have node && ! have npm; then echo none
  else echo partial
  fi
}

declare -A was_missing=()
missing_pkgs=()
add_pkg() {
  local p
  for p in "$@"; do
    case " ${missing_pkgs[*]} " in *" $p "*) ;; *) missing_pkgs+=("$p") ;; esac
  done
}

for entry in "${APT_CHECKS[@]}"; do
  IFS='|' read -r name pkg fn <<<"$entry"
  if ! "$fn"; then was_missing[$name]=1; add_pkg $pkg; fi
done
node_before="$(node_state)"
[ "$node_before" = none ] && add_pkg nodejs npm

apt_failed=0
if [ ${#missing_pkgs[@]} -gt 0 ] && is_root; then
  say deps "installing with apt-get: ${missing_pkgs[*]}"
  if ! apt-get update -q >/tmp/sbx-apt-update.log 2>&1; then
    say deps "apt-get update failed; tail of /tmp/sbx-apt-update.log:"
    tail -n 15 /tmp/sbx-apt-update.log
    apt_failed=1
  elif ! $APT_INSTALL "${missing_pkgs[@]}" >/tmp/sbx-apt-install.log 2>&1; then
    say deps "apt-get install failed; tail of /tmp/sbx-apt-install.log:"
    tail -n 25 /tmp/sbx-apt-install.log
    apt_failed=1
  fi
fi

still_missing=()
for entry in "${APT_CHECKS[@]}"; do
  IFS='|' read -r name pkg fn <<<"$entry"
  if "$fn"; then
    if [ -n "${was_missing[$name]:-}" ]; then line "$name" "installed"; else line "$name" "ok"; fi
  else
    still_missing+=($pkg)
    line "$name" "missing: apt-get install $pkg"
    failed=1
  fi
done

case "$(node_state)" in
  ok)
    if [ "$node_before" = ok ]; then line "node + npm" "ok ($(node --version))"
    else line "node + npm" "installed ($(node --version))"; fi ;;
  none)
    still_missing+=(nodejs npm)
    line "node + npm" "missing: apt-get install nodejs npm"
    failed=1 ;;
  partial)
    if have node; then line "node + npm" "missing: npm (node is $(command -v node)): install the npm that belongs to that Node.js (not Debian's npm, which conflicts with nodesource's nodejs)"
    else line "node + npm" "missing: node (npm is $(command -v npm)): install the Node.js that npm belongs to"; fi
    failed=1 ;;
esac

# ---- Bun, from the npm registry ----------------------------------------------
bun_ok() { have bun && bun --version >/dev/null 2>&1; }
if bun_ok; then
  line "bun" "ok ($(bun --version))"
elif ! have npm; then
  line "bun" "missing: install node + npm first, then: npm install -g bun"
  failed=1
elif is_root; then
  if npm install -g --no-audit --no-fund bun >/tmp/sbx-npm-bun.log 2>&1 && hash -r && bun_ok; then
    line "bun" "installed ($(bun --version))"
  else
    line "bun" "missing: \`npm install -g bun\` failed; tail of /tmp/sbx-npm-bun.log:"
    tail -n 15 /tmp/sbx-npm-bun.log
    failed=1
  fi
else
  line "bun" "missing: sudo npm install -g bun"
  failed=1
fi

# ---- MCP SDK for the spec fixtures (spec/fixtures/node_modules) ---------------
# A stamp holding the lock file's hash says whether node_modules matches it.
fixtures_stamp="$FIXTURES/node_modules/.sbx-lock.sha256"
lock_hash() { sha256sum "$FIXTURES/package-lock.json" | cut -d' ' -f1; }
fixtures_ok() {
  [ -f "$fixtures_stamp" ] && [ "$(cat "$fixtures_stamp")" = "$(lock_hash)" ] &&
    [ -f "$FIXTURES/node_modules/@modelcontextprotocol/sdk/package.json" ]
}
if [ ! -f "$FIXTURES/package-lock.json" ]; then
  line "spec fixtures (npm)" "missing: $FIXTURES/package-lock.json (not in this checkout)"
  failed=1
elif fixtures_ok; then
  line "spec fixtures (npm)" "ok"
elif ! have npm; then
  line "spec fixtures (npm)" "missing: install node + npm, then: (cd $FIXTURES && npm ci)"
  failed=1
elif (cd "$FIXTURES" && npm ci --no-audit --no-fund >/tmp/sbx-npm-ci.$$.log 2>&1); then
  lock_hash >"$fixtures_stamp"
  line "spec fixtures (npm)" "installed (npm ci)"
  rm -f /tmp/sbx-npm-ci.$$.log
else
  line "spec fixtures (npm)" "missing: \`npm ci\` in $FIXTURES failed; tail of its log:"
  tail -n 15 /tmp/sbx-npm-ci.$$.log
  failed=1
fi

# ---- the Bun package's dev tools (bun/node_modules: typescript, @types/bun) ----
# Its prepack runs tsc from there (bun/scripts/build.ts); a stamp holding
# bun.lock's hash says whether node_modules matches it.
bun_stamp="bun/node_modules/.sbx-lock.sha256"
bun_lock_hash() { sha256sum bun/bun.lock | cut -d' ' -f1; }
if [ -f "$bun_stamp" ] && [ "$(cat "$bun_stamp")" = "$(bun_lock_hash)" ] && [ -x bun/node_modules/.bin/tsc ]; then
  line "bun package dev tools" "ok"
elif ! bun_ok; then
  line "bun package dev tools" "missing: install bun first, then: (cd bun && bun install --frozen-lockfile)"
  failed=1
elif (cd bun && timeout 600 bun install --frozen-lockfile >/tmp/sbx-bun-install.$$.log 2>&1) && [ -x bun/node_modules/.bin/tsc ]; then
  bun_lock_hash >"$bun_stamp"
  line "bun package dev tools" "installed (bun install)"
  rm -f /tmp/sbx-bun-install.$$.log
else
  line "bun package dev tools" "missing: \`bun install --frozen-lockfile\` in bun/ failed; tail of its log:"
  tail -n 15 /tmp/sbx-bun-install.$$.log
  failed=1
fi

# ---- Docker daemon -------------------------------------------------------------
docker_up() { have docker && timeout 10 docker info >/dev/null 2>&1; }
if docker_up; then
  line "docker daemon" "ok"
elif ! have dockerd; then
  line "docker daemon" "missing: install docker.io first"
  failed=1
elif is_root; then
  # No systemd on these machines: start the daemon ourselves, in the background
  # (mounting the cgroup hierarchies first if nothing did at boot).
  if ! grep -qE '^cgroup2? ' /proc/mounts && have cgroupfs-mount; then cgroupfs-mount || true; fi
  nohup dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
  for _ in $(seq 1 30); do docker_up && break; sleep 1; done
  if docker_up; then
    line "docker daemon" "installed (dockerd started, log $DOCKERD_LOG)"
  else
    line "docker daemon" "missing: dockerd did not answer within 30 s; tail of $DOCKERD_LOG:"
    tail -n 15 "$DOCKERD_LOG"
    failed=1
  fi
elif [ -S /var/run/docker.sock ]; then
  line "docker daemon" "missing: no access to /var/run/docker.sock: sudo usermod -aG docker $(id -un), then log in again"
  failed=1
else
  line "docker daemon" "missing: not running: sudo make deps (starts dockerd), or sudo systemctl start docker"
  failed=1
fi

# ---- Container runtimes (RUNSC=1; shared/spec/warm-turns.md 4) -------------------
# With RUNSC=1 (the Makefile sets it under CI=true): Debian's runsc (gVisor)
# and crun, registered in the daemon's configuration (merged into
# /etc/docker/daemon.json with jq, every other key kept) and the daemon
# reloaded with SIGHUP (running containers keep running), then checked with
# `docker info`. runsc gets --network=none and --fsgofer-host-uds (gVisor
# otherwise refuses the bind-mounted broker socket; this runsc still takes
# that flag, a deprecated alias of --host-uds=all), and --oci-seccomp: without
# it gVisor ignores the container's seccomp profile (hardening.md 1), so
# `sbx doctor` fails a runsc registered without it. crun is registered plain,
# to be measured beside runc (`make bench`); nothing depends on it (it
# refuses hosts with a hybrid cgroup v1 + v2 hierarchy, as some VMs have).
DAEMON_JSON="/etc/docker/daemon.json"
RUNSC_ARGS='["--network=none","--fsgofer-host-uds","--oci-seccomp"]'
registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | jq -e --arg n "$1" 'has($n)' >/dev/null 2>&1; }
# in_sync NAME: the daemon lists NAME exactly as daemon.json registers it.
in_sync() {
  local want
  want="$(jq -cS --arg n "$1" '.runtimes[$n]' "$DAEMON_JSON" 2>/dev/null)" || return 1
  [ "$want" != null ] &&
    [ "$(docker info --format '{{json .Runtimes}}' 2>/dev/null | jq -cS --arg n "$1" '.[$n]')" = "$want" ]
}
# register NAME PATH ARGS_JSON: merges runtimes.NAME into daemon.json; prints
# "changed" when the file changed. Fails (nothing written) on a file that is not JSON.
register() {
  local cur new
  if [ -f "$DAEMON_JSON" ]; then cur="$(cat "$DAEMON_JSON")"; else cur='{}'; fi
  new="$(printf '%s' "$cur" | jq --arg n "$1" --arg p "$2" --argjson a "$3" \
    '.runtimes[$n] = ({path: $p} + (if $a == [] then {} else {runtimeArgs: $a} end))')" || return 1
  if [ "$(printf '%s' "$cur" | jq -S .)" != "$(printf '%s' "$new" | jq -S .)" ]; then
    mkdir -p "$(dirname "$DAEMON_JSON")" &&
      printf '%s\n' "$new" >"$DAEMON_JSON.sbx-tmp" && mv "$DAEMON_JSON.sbx-tmp" "$DAEMON_JSON" &&
      echo changed
  fi
}
reload_dockerd() {
  local pid=""
  [ -f /var/run/docker.pid ] && pid="$(cat /var/run/docker.pid)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || pid="$(pidof dockerd | cut -d' ' -f1)"
  [ -n "$pid" ] && kill -HUP "$pid"
}
if [ "${RUNSC:-}" = 1 ]; then
  rt_pkgs=()
  [ -x /usr/bin/runsc ] || rt_pkgs+=(runsc)
  [ -x /usr/bin/crun ] || rt_pkgs+=(crun)
  have jq || rt_pkgs+=(jq)
  if [ ${#rt_pkgs[@]} -gt 0 ] && is_root; then
    say deps "installing with apt-get (RUNSC=1): ${rt_pkgs[*]}"
    $APT_INSTALL "${rt_pkgs[@]}" >/tmp/sbx-apt-runsc.log 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && $APT_INSTALL "${rt_pkgs[@]}" >>/tmp/sbx-apt-runsc.log 2>&1; } ||
      { say deps "apt-get install ${rt_pkgs[*]} failed; tail of /tmp/sbx-apt-runsc.log:"; tail -n 15 /tmp/sbx-apt-runsc.log; }
  fi
  changed=""
  for rt in "runsc|/usr/bin/runsc|$RUNSC_ARGS" "crun|/usr/bin/crun|[]"; do
    IFS='|' read -r name path args <<<"$rt"
    if [ ! -x "$path" ]; then
      line "$name (RUNSC=1)" "missing: apt-get install $name"
      failed=1
    elif ! have jq; then
      line "$name (RUNSC=1)" "missing: apt-get install jq (merges $DAEMON_JSON)"
      failed=1
    elif ! is_root; then
      registered "$name" && line "$name (RUNSC=1)" "ok (registered with the daemon)" ||
        { line "$name (RUNSC=1)" "missing: not registered with the daemon: sudo make deps RUNSC=1"; failed=1; }
    elif out="$(register "$name" "$path" "$args")"; then
      [ -n "$out" ] && changed="$changed $name"
    else
      line "$name (RUNSC=1)" "missing: $DAEMON_JSON is not valid JSON; fix it, then make deps RUNSC=1"
      failed=1
    fi
  done
  if is_root && have jq && docker_up; then
    if [ -n "$changed" ]; then
      reload_dockerd
      for _ in $(seq 1 20); do in_sync runsc && in_sync crun && break; sleep 0.5; done
    fi
    for name in runsc crun; do
      [ -x "/usr/bin/$name" ] || continue
      if in_sync "$name"; then
        case " $changed " in *" $name "*) what="installed" ;; *) what="ok" ;; esac
        line "$name (RUNSC=1)" "$what (registered with the daemon: $(docker info --format '{{json .Runtimes}}' |
          jq -c --arg n "$name" '.[$n]'))"
      else
        line "$name (RUNSC=1)" "missing: registered in $DAEMON_JSON but the daemon does not list it after SIGHUP (see $DOCKERD_LOG)"
        failed=1
      fi
    done
  elif is_root && have jq; then
    line "runsc, crun (RUNSC=1)" "missing: the Docker daemon does not answer, so nothing was registered"
    failed=1
  fi
fi

# ---- The non-root service account ----------------------------------------------
# The product refuses to run as root, so as root the tests run as this account.
in_docker_group() { id -nG "$SBX_USER" 2>/dev/null | tr ' ' '\n' | grep -qx docker; }
if id "$SBX_USER" >/dev/null 2>&1 && in_docker_group; then
  line "service account $SBX_USER" "ok (uid $(id -u "$SBX_USER"), in group docker)"
elif ! is_root; then
  # Only needed when the tests run as root; a normal user runs them as itself.
  line "service account $SBX_USER" "not needed as $(id -un) (sudo make deps creates it)"
else
  getent group docker >/dev/null 2>&1 || groupadd --system docker
  if id "$SBX_USER" >/dev/null 2>&1; then
    usermod -aG docker "$SBX_USER"
  else
    useradd --system --create-home --home-dir "/var/lib/$SBX_USER" \
      --shell /usr/sbin/nologin --groups docker "$SBX_USER"
    chmod 0750 "/var/lib/$SBX_USER"
  fi
  if id "$SBX_USER" >/dev/null 2>&1 && in_docker_group; then
    line "service account $SBX_USER" "installed (uid $(id -u "$SBX_USER"), in group docker)"
  else
    line "service account $SBX_USER" "missing: useradd --system --create-home --groups docker $SBX_USER failed"
    failed=1
  fi
fi

if [ ${#still_missing[@]} -gt 0 ] && ! is_root; then
  fix=(); for p in "${still_missing[@]}"; do case " ${fix[*]} " in *" $p "*) ;; *) fix+=("$p") ;; esac; done
  say deps "fix (as root): apt-get update && DEBIAN_FRONTEND=noninteractive $APT_INSTALL ${fix[*]}"
  say deps "or run \`sudo make deps\` to install everything this project needs"
fi
if [ "$failed" -ne 0 ]; then
  say deps "FAILED: something above is missing (see the fix on its line)"
  exit 1
fi
[ "$apt_failed" -eq 0 ] || exit 1
say deps "all present"
