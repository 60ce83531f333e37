-- precheck/_docker.lua: the precheck runner's default driver (shared/spec/
-- precheck.md 4 step 8, 6.1): the sealed turns' Docker CLI driver
-- (lua/sandbox/drivers/cli.lua) running a precheck container spec.
--
--   driver.exec(spec, input, signal, {stdoutBytes=N}) -> stdout (yields)
--   (a plain function member, as the spec's `driver` seam is called)
--
-- The argv is lua/sandbox/drivers/_sealed.lua's with the precheck's
-- parameters (no labels, read-only workspace, `--entrypoint`); the run and
-- the removal algorithm (3 tries x 5 s, one more removal 100 ms after an
-- abort or a non-zero exit) are the driver contract's
-- (lua/sandbox/drivers/contract.lua, over the CLI driver's primitives), so a
-- precheck container dies and is removed exactly like a sealed turn's.
-- Raises the abort reason, `body too large`, `sandbox worker failed` or the
-- cleanup error. Every precheck container runs under the precheck image's own
-- seccomp allow-list (worker/precheck/seccomp.json, or the path given to new),
-- read once at construction (startup): `--security-opt seccomp=<path>`; a
-- missing one raises `seccomp profile missing: <path>`, never a fallback.
local container = require "sandbox.drivers._sealed"
local contract = require "sandbox.drivers.contract"
local seccomp = require "sandbox.runtime._seccomp"

local M = {}

function M.new(cli, seccomp_profile)
  local profile = seccomp.load(seccomp_profile or seccomp.default_path("precheck"))
  local d = { builtin = true, seccomp = { path = profile.path, count = profile.count } }
  function d.exec(spec, input, signal, o)
    local s = {}
    if type(spec) == "table" then for k, v in pairs(spec) do s[k] = v end end
    s.seccompProfile = profile.path
    local c = container.check(type(spec) == "table" and s or spec)
    return contract.attached(cli, c, input, signal, { max_stdout = o and o.stdoutBytes or nil })
  end
  -- `docker rm --force <name>` with the removal algorithm (for stale
  -- roundtable-precheck- containers).
  function d.remove(name) return contract.remove(cli, name) end
  return d
end

return M
