-- broker/_credential.lua: calling the operator's apiKey hooks (spec/broker.md 9.6,
-- 11.2). A hook runs as its own coroutine and may yield; the call waits for
-- it or for the call signal, whichever comes first. The scope handed to the
-- hook is a fresh table each time, so nothing the hook does reaches the
-- broker. A credential is printable ASCII (0x21-0x7E) only, so it cannot
-- smuggle header syntax, and is never logged.
local async = require "sandbox.async"

local M = {}

M.MAX_BYTES = 4096

function M.scope(channel, speaker)
  return {
    channel = channel,
    speaker = { id = speaker.id, name = speaker.name, principalId = speaker.principalId },
  }
end

-- Runs hook(scope) bounded by signal. Returns:
--   "ok", value     the hook returned (value may be anything)
--   "error"         the hook raised, or the signal aborted first
function M.call_hook(hook, scope, signal)
  if signal.aborted then return "error" end
  local task = async.spawn(hook, scope)
  if not async.wait_or_abort(task, signal) or signal.aborted or not task.ok then return "error" end
  return "ok", task.results[2]
end

-- A usable credential: a non-empty string of visible ASCII within bounds.
function M.valid(value)
  return type(value) == "string" and #value > 0 and #value <= M.MAX_BYTES
    and not value:find("[^\33-\126]")
end

-- The model route's rule: anything but a valid credential fails closed.
function M.for_model(hook, scope, signal)
  if type(hook) ~= "function" then return nil end
  local status, value = M.call_hook(hook, scope, signal)
  if status ~= "ok" or not M.valid(value) then return nil end
  return value
end

-- The MCP rule: no hook, nil or "" means an unauthenticated call ("none");
-- a valid credential is used ("key", value); anything else fails ("error").
function M.for_mcp(hook, scope, signal)
  if hook == nil then return "none" end
  local status, value = M.call_hook(hook, scope, signal)
  if status ~= "ok" then return "error" end
  if value == nil or value == "" then return "none" end
  if not M.valid(value) then return "error" end
  return "key", value
end

return M
