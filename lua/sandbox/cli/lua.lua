-- cli/lua.lua: `sbx lua SCRIPT [ARGS...]`: runs a Lua script with the sandbox
-- modules and the event loop, as OpenResty's `resty` does: the script is a
-- top-level task that may yield on async primitives (sleep, HTTP, sockets).
local async = require "sandbox.async"

local M = {}

M.help = [==[
usage: sbx lua SCRIPT [ARGS...]

Runs SCRIPT as a task on the engine's event loop. Inside it, `require
"sandbox"`, `require "sandbox.async"` (sleep, await, spawn) and `require
"sandbox.core"` are available and calls that wait yield instead of blocking.
The global `arg` holds ARGS (arg[0] is SCRIPT). The exit status is the
script's integer return value, 0 otherwise, or 1 when it raises.
]==]

function M.run(args)
  local script = args[1]
  if not script then
    io.stderr:write("sbx lua: SCRIPT is required\n\n", M.help)
    return 2
  end
  local chunk, err = loadfile(script, "t")
  if not chunk then
    io.stderr:write("sbx lua: ", err, "\n")
    return 1
  end
  local script_args = { [0] = script }
  for i = 2, #args do script_args[i - 1] = args[i] end
  _G.arg = script_args
  local ok, result = pcall(async.run, chunk, table.unpack(script_args))
  if not ok then
    io.stderr:write("sbx lua: ", tostring(result), "\n")
    return 1
  end
  return math.type(result) == "integer" and result or 0
end

return M
