-- broker/_budget.lua: the operator's optional `budget` hook (host Lua, like
-- apiKey), asked before a turn is admitted and before each of its model
-- calls whether this channel and speaker may go on, and told once the turn
-- settled, so it can keep its own accounts (per-channel daily tokens, say:
-- examples/daily_budget.lua). The hook runs as its own coroutine, bounded
-- by the turn's (or call's) signal, and gets a fresh scope each time:
--
--   budget({channel=, speaker={id,name,principalId}, turn=<id>,
--           phase="admission"|"model_call"|"settled",
--           used={input=, output=, cached=, reasoning=, model_calls=}})
--     -> false refuses (any other answer allows); raising refuses too
--
-- `used` is this turn's so far: the provider-reported tokens of its model
-- calls (ops/record.lua), zero at admission, the whole turn's at "settled"
-- (whose answer is ignored). A refusal gives the guest the generic failure
-- text and the operator the reason budget_exceeded; the hook's own words
-- never reach anyone.
local credential = require "sandbox.broker._credential"

local M = {}

M.PHASES = { admission = true, model_call = true, settled = true }

function M.used(t)
  t = t or {}
  return {
    input = t.tokens_in or 0, output = t.tokens_out or 0, cached = t.tokens_cached or 0,
    reasoning = t.tokens_reasoning or 0, model_calls = t.model_calls or 0,
  }
end

function M.scope(channel, speaker, turn_id, phase, t)
  local s = credential.scope(channel, speaker)
  s.turn, s.phase, s.used = turn_id, phase, M.used(t)
  return s
end

-- true, or false and why: "refused" (the hook answered false), "raised",
-- "aborted" (the signal ended first: not the hook's refusal).
function M.allows(hook, scope, signal)
  local status, value = credential.call_hook(hook, scope, signal)
  if status ~= "ok" then return false, value end
  if value == false then return false, "refused" end
  return true
end

return M
