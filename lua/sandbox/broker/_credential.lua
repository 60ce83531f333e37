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
--   "ok", value          the hook returned (value may be anything)
--   "error", "raised"    the hook raised
--   "error", "aborted"   the signal aborted first
function M.call_hook(hook, scope, signal)
  if signal.aborted then return "error", "aborted" end
  local task = async.spawn(hook, scope)
  if not async.wait_or_abort(task, signal) or signal.aborted then return "error", "aborted" end
  if not task.ok then return "error", "raised" end
  return "ok", task.results[2]
end

-- The turn reason of a failed hook call (spec/operations.md 1), or nil for
-- an abort (the turn or the call ended: not the hook's fault).
local function why(status)
  if status == "raised" then return "credential_error" end
  if status == "aborted" then return nil end
  return "credential_missing"
end

-- A usable credential: a non-empty string of visible ASCII within bounds.
function M.valid(value)
  return type(value) == "string" and #value > 0 and #value <= M.MAX_BYTES
    and not value:find("[^\33-\126]")
end

-- The model route's rule: anything but a valid credential fails closed.
-- Returns the credential, or nil and the reason ("credential_missing",
-- "credential_error", or nil when the call signal aborted).
function M.for_model(hook, scope, signal)
  if type(hook) ~= "function" then return nil, "credential_missing" end
  local status, value = M.call_hook(hook, scope, signal)
  if status ~= "ok" then return nil, why(value) end
  if not M.valid(value) then return nil, "credential_missing" end
  return value
end

-- The MCP rule: no hook, nil or "" means an unauthenticated call ("none");
-- a valid credential is used ("key", value); anything else fails ("error",
-- and the reason as for_model's).
function M.for_mcp(hook, scope, signal)
  if hook == nil then return "none" end
  local status, value = M.call_hook(hook, scope, signal)
  if status ~= "ok" then return "error", why(value) end
  if value == nil or value == "" then return "none" end
  if not M.valid(value) then return "error", "credential_missing" end
  return "key", value
end

return M
