-- docker_runtime.lua: the container runtime the Docker specs run under
-- (shared/spec/warm-turns.md 4). `make check` runs spec/docker/*_spec.lua
-- twice: with the daemon's default runtime, then with SBX_RUNTIME=runsc
-- when the daemon has runsc registered (scripts/check.sh, suite
-- docker-runsc). Every runtime, driver spec and config a Docker spec builds
-- takes its `runtime` from here, so the second pass runs the very same
-- cases under gVisor.
--
--   local D = require "docker_runtime"
--   D.name                 -> "runsc", or nil (the daemon's default)
--   D.lua()                -> `runtime = "runsc",` (or "") for a config's source
local M = {}

local name = os.getenv("SBX_RUNTIME")
if name == "" then name = nil end
M.name = name

function M.lua()
  return M.name and string.format("runtime = %q,", M.name) or ""
end

return M
