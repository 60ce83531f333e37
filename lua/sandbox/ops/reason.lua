-- ops/reason.lua: the turn's one failure reason (spec/operations.md 1),
-- decided by the HOST from what it observed: the turn's broker calls (its
-- record, ops/record.lua), the error the turn raised (a catalogue message:
-- the deadline, a stop, the driver's view of the exit and inspect state, a
-- removal failure), the reply read from stdout and the exit status. The
-- worker may add one reason of its own closed list (errors.WORKER_REASONS)
-- by printing {"ok":false,"reason":...}; it is kept only when nothing the
-- host saw explains the failure and nothing contradicts it, so a hostile
-- worker can at worst mislabel its own failure. Pure: no I/O.
--
--   reason.decide(t, outcome) -> reason
--     t        the turn record (last_model: the last /model call record)
--     outcome  {error = the raised message or nil, reply = {ok, text} or nil,
--               aborted = the turn signal's abort reason before it settled
--               (the deadline, a stop) or nil, worker_reason = what the
--               worker claimed or nil}
--
-- Precedence, first match wins:
--   1. an error whose catalogue entry names a reason (cleanup_failed, the
--      hardening refusals workspace_quota, disk_low, host_descriptors,
--      daemon_unavailable, image_missing, worker_oom, deadline, stopped):
--      the host saw it happen, nothing the worker says changes it;
--   2. a failed worker (exit status not 0, an invalid reply, or ok=false)
--      whose last /model call failed: that call's reason (upstream_status,
--      upstream_unreachable, upstream_timeout, upstream_invalid, reflection,
--      credential_missing, credential_error; a /model call refused for the
--      spent budget: budget_exhausted), since the worker fails on any
--      refused /model call;
--   3. an invalid reply: invalid_reply;
--   4. the worker's own reason, when consistent with the last /model call
--      (model_no_text and model_filtered need a 200 reply without tool calls,
--      model_filtered one whose finish_reason was content_filter);
--   5. a last /model 200 without choices[0].message: upstream_invalid;
--   6. ok=false with exit 0: budget_exhausted (the worker's model-call
--      limit: a model loop spent the turn's calls);
--   7. worker_failed.
local errors = require "sandbox.errors"

local M = {}

-- The turn reason a failed /model call explains, or nil.
local function model_failure(c)
  if c == nil or c.status == 200 then return nil end
  if c.reason == "budget" then return "budget_exhausted" end
  local r = errors.reason(c.reason)
  if r and c.accepted and c.reason ~= "tool_failed" then return c.reason end
  return nil
end

local function consistent(claim, last)
  if not errors.WORKER_REASONS[claim] then return false end
  if claim == "model_no_text" or claim == "model_filtered" then
    local reply = last and last.status == 200 and last.reply
    if not reply or not reply.message or reply.tool_calls then return false end
    if claim == "model_filtered" then return reply.finish == "content_filter" end
  end
  return true
end

function M.decide(t, outcome)
  local err = outcome.error
  if err == nil and outcome.reply and outcome.reply.ok then return "ok" end
  local entry = err ~= nil and errors.entry(err) or nil
  local named = entry and entry.reason
  local abort = outcome.aborted and errors.entry(outcome.aborted)
  -- (a turn that waited for descriptors until its deadline: host_descriptors)
  if abort and abort.reason and named ~= "cleanup_failed" and named ~= "daemon_unavailable"
      and named ~= "host_descriptors" then
    return abort.reason                               -- 1: the deadline or a stop
  end
  if named and named ~= "worker_failed" and named ~= "invalid_reply" then return named end  -- 1
  local last = t.last_model
  local from_model = model_failure(last)
  if from_model then return from_model end                                               -- 2
  if named == "invalid_reply" then return "invalid_reply" end                            -- 3
  local claim = outcome.worker_reason
  if claim and consistent(claim, last) then return claim end                             -- 4
  if last and last.status == 200 and last.reply and not last.reply.message then
    return "upstream_invalid"                                                            -- 5
  end
  if err == nil and outcome.reply and outcome.reply.ok == false then return "budget_exhausted" end  -- 6
  return "worker_failed"                                                                 -- 7
end

return M
