-- rich/broker/_tools.lua: POST /tools/<name> (spec/rich-mode.md 12). The
-- body is {"input":{...}}; every other member (channel, author, speaker,
-- target, credential) is ignored. The callback gets the identity of the
-- scope that admitted the call, never the body's, and a signal that aborts
-- with the turn or the request. Its answer is checked and rebuilt from the
-- known members only; a privateTo answer raises the privacy requirement, and
-- an image that cannot keep it private never sees the payload (14.1).
local async = require "sandbox.async"
local audit = require "sandbox.rich.broker._audit"
local errors = require "sandbox.errors"
local forward = require "sandbox.rich.broker._forward"
local json = require "sandbox.json"
local log = require "sandbox.rich._log"
local media = require "sandbox.rich._media"
local text = require "sandbox.rich._text"
local worker = require "sandbox.rich.broker._worker"

local M = {}

M.BAD_INPUT = "Invalid tool input"
M.MAX_TEXT = 1000000
M.MAX_ERROR = 10000
M.MAX_PRINCIPAL = 256

-- The answer rebuilt from {ok, text?, error?, image?, privateTo?}, or nil.
function M.answer(r)
  if type(r) ~= "table" or type(r.ok) ~= "boolean" then return nil end
  if r.text ~= nil and not text.within(r.text, 0, M.MAX_TEXT) then return nil end
  if r.error ~= nil and not text.within(r.error, 0, M.MAX_ERROR) then return nil end
  if r.privateTo ~= nil and not text.within(r.privateTo, 1, M.MAX_PRINCIPAL) then return nil end
  local image
  if r.image ~= nil then
    if type(r.image) ~= "table" or not media.check_image(r.image) then return nil end
    image = json.object({ "data", "mimeType" }, { data = r.image.data, mimeType = r.image.mimeType })
  end
  return json.object({ "ok", "text", "error", "image", "privateTo" }, {
    ok = r.ok, text = r.text, error = r.error, image = image, privateTo = r.privateTo,
  })
end

-- The body's shape (issue 21): only `input` is read; every other member is
-- dropped unread (12: "every other body field is ignored").
M.SHAPE = { unknown = "drop", members = { input = true } }

function M.handle(b, conn, call)
  local s, name = call.scope, call.name
  local label = "tool:" .. name
  local function failure(err, why)
    audit.why(call, why or "tool_failed")
    log.upstream_failure(b.log, { channel = s.channel, turn = s.turnId, upstream = label, latencyMs = b.clock.now() - call.started, error = err })
    return conn:reply(502, forward.FAILED)
  end
  local input = call.body.input
  if json.kind(input) ~= "object" then
    audit.why(call, "payload")
    return conn:reply(400, M.BAD_INPUT)
  end
  local sp = s.speaker
  local ctx = {
    channel = s.channel, profile = s.profile, speaker = { id = sp.id, name = sp.name, principalId = sp.principalId },
    thinking = s.thinking, deadline = call.deadline, signal = call.signal,
  }
  local task = async.spawn(b.tools.call, name, input, ctx)
  if not async.wait_or_abort(task, call.signal) then return failure("aborted", audit.aborted(call)) end
  if not task.ok then return failure(task.results[2]) end
  local answer = M.answer(task.results[2])
  if not answer then return failure(errors.RICH_TOOL_OUTPUT) end
  if answer.privateTo ~= nil then
    b.requirement = true
    local problem = worker.enforce(b, s)
    if problem then
      audit.why(call, "payload")
      return conn:reply(409, problem)
    end
  end
  if call.signal.aborted then return failure("aborted", audit.aborted(call)) end
  return conn:reply(200, json.encode(answer), "application/json")
end

return M
