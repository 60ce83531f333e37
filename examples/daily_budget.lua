-- examples/daily_budget.lua: per-channel daily token limits for the
-- `budget` hook (docs/options.md), kept in a file of the state directory so
-- they survive restarts. Copy it beside your config and adjust:
--
--   local daily_budget = dofile("/etc/roundtable/daily_budget.lua")
--   return sandbox {
--     -- ...
--     budget = daily_budget.new {
--       file = "/var/lib/roundtable-sandbox/state/budget.json",   -- the stateFile's directory
--       limit = 200000,                                            -- tokens a channel may use per UTC day
--       limits = { ["discord:team-a"] = 1000000 },                 -- per-channel exceptions
--     },
--   }
--
-- The hook refuses a turn at admission, and a model call within a turn,
-- once the channel's tokens of the day (input + output, as the provider
-- reported them) reached its limit; the guest gets the generic failure
-- text, the operator `reason=budget_exceeded`. Each settled turn's tokens
-- are added to the channel's count and the file is written atomically
-- (core.write_file_atomic: a crash leaves the old or the new count, never a
-- torn file). A new UTC day starts every channel from zero. Channel keys are
-- stored as their SHA-256, so the file holds no guest-chosen text.
local core = require "sandbox.core"
local json = require "sandbox.json"

local M = {}

M.MAX_FILE = 4 * 1024 * 1024

local function today() return os.date("!%Y-%m-%d") end

local function load(file)
  local bytes = core.read_file_nofollow(file, M.MAX_FILE)
  local v = bytes and json.decode(bytes)
  if json.kind(v) ~= "object" or type(v.day) ~= "string" or json.kind(v.used) ~= "object" then
    return { day = today(), used = {} }
  end
  local used = {}
  for k, n in pairs(v.used) do
    if type(k) == "string" and math.type(n) == "integer" and n >= 0 then used[k] = n end
  end
  return { day = v.day, used = used }
end

local function save(file, state)
  local keys = {}
  for k in pairs(state.used) do keys[#keys + 1] = k end
  table.sort(keys)
  local used = json.object(keys, state.used)
  local ok, err = core.write_file_atomic(file, json.encode(json.object({ "day", "used" }, { day = state.day, used = used })))
  if not ok then error("daily budget: cannot write " .. file .. ": " .. tostring(err), 0) end
end

-- o = {file=, limit=, limits={[channel]=n}} -> the budget hook
function M.new(o)
  assert(type(o.file) == "string", "daily_budget: file is required")
  assert(math.type(o.limit) == "integer" and o.limit > 0, "daily_budget: limit must be a positive integer")
  local state = load(o.file)
  local limits = o.limits or {}

  local function roll()
    local d = today()
    if state.day ~= d then state.day, state.used = d, {} end
  end

  return function(scope)
    roll()
    local key = core.sha256_hex(scope.channel)
    local spent = state.used[key] or 0
    local turn_tokens = scope.used.input + scope.used.output
    if scope.phase == "settled" then
      if turn_tokens > 0 then
        state.used[key] = spent + turn_tokens
        save(o.file, state)
      end
      return true
    end
    return spent + turn_tokens < (limits[scope.channel] or o.limit)
  end
end

return M
