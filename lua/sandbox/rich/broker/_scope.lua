-- rich/broker/_scope.lua: the scopes a budgeted call is admitted under
-- (spec/rich-mode.md 9 steps 5, 10, 11; 13.3). A scope is the identity,
-- credential context and budget of the calls it admits:
--   startup  armed when the broker is built and re-armed by ready/discovery:
--            channel "sandbox:startup", no profile or speaker, thinking low,
--            32 calls, 4 in flight, 90 s; only MCP metadata methods use it
--   turn     made by bind() from the host's context: maxCalls calls, 4 in
--            flight, until the turn's signal aborts or the scope is failed
-- Each call stays in the scope that admitted it, whatever binds later.
--
--   scope.startup(now, max_calls_override) / scope.turn(ctx, max_calls)
--   scope.usable(s, now)      -> step 5: present, not aborted, failed or expired
--   scope.admit(s)            -> step 10/11: true (counted) | false (429)
--   scope.settle(s)           the call's handler settled (active - 1)
--   scope.fail(s, problem)    marks the scope failed (later calls get 410)
local core = require "sandbox.core"
local signal = require "sandbox.signal"

local M = {}

M.STARTUP_CHANNEL = "sandbox:startup"
M.STARTUP_CALLS = 32
M.STARTUP_MS = 90000
M.REARM_SPACING_MS = 10000
M.MAX_ACTIVE = 4

local function copy_speaker(sp)
  sp = type(sp) == "table" and sp or {}
  local function s(v) return type(v) == "string" and v or "" end
  local id = s(sp.id)
  local principal = s(sp.principalId)
  if principal == "" then principal = id end
  return { id = id, name = s(sp.name), principalId = principal }
end
M.copy_speaker = copy_speaker

function M.startup(now)
  return {
    kind = "startup", channel = M.STARTUP_CHANNEL, profile = "",
    speaker = { id = "", name = "", principalId = "" }, thinking = "low",
    signal = signal.new(), remaining = M.STARTUP_CALLS, active = 0,
    expires = now + M.STARTUP_MS, armed_at = now,
  }
end

-- ctx = {channel, profile, speaker, thinking, signal, deadline, turnId?}:
-- copied (turnId names the turn in the audit lines).
function M.turn(ctx, max_calls)
  return {
    kind = "turn", channel = ctx.channel, profile = ctx.profile or "",
    turnId = type(ctx.turnId) == "string" and ctx.turnId or nil,
    record = ctx.record,                -- the turn's record (ops/record.lua), when a runtime binds it
    speaker = copy_speaker(ctx.speaker), thinking = ctx.thinking or "low",
    signal = ctx.signal or signal.new(), deadline = ctx.deadline,
    remaining = max_calls, active = 0,
    compactions = 0, reports = 0,       -- section 15's counters (part 2)
  }
end

function M.usable(s, now)
  if s == nil or s.gone or s.failed or s.signal.aborted then return false end
  if s.expires and now >= s.expires then return false end
  return true
end

function M.admit(s)
  if s.remaining <= 0 or s.active >= M.MAX_ACTIVE then return false end
  s.remaining = s.remaining - 1
  s.active = s.active + 1
  return true
end

function M.settle(s)
  s.active = s.active - 1
end

function M.fail(s, problem)
  if s and not s.failed then s.failed = problem or true end
end

-- The scope's credential scope handed to oauthToken (11.3): a fresh table.
function M.credential_scope(s)
  local sp = s.speaker
  return { channel = s.channel, speaker = { id = sp.id, name = sp.name, principalId = sp.principalId } }
end

-- The call deadline: the turn's, or turnTimeoutMs from now for the startup scope.
function M.deadline(s, turn_ms)
  return s.deadline or (core.now() + turn_ms)
end

return M
