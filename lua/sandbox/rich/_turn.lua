-- rich/_turn.lua: rt:runTurn{channel, profile, turnId, author={id, name,
-- principalId?}, text, images, signal?} (spec/rich-mode.md 7) -> {ok=true,
-- text, files={{name, data=<bytes>}}} or {ok=false, error, cause}. One turn
-- per channel at a time. Every turn is one turn record (ops/record.lua,
-- mode "rich"): its `turn finished` line with reason and fix, and
-- sbx_turns_total{mode="rich",reason} (spec/operations.md 3-4). Identity is bound to the channel's broker
-- immediately before the turn is queued and revoked when it settles; an
-- aborted turn (timeout, the caller's signal, stop) removes the container
-- after its log is captured. principalId is the admitted principal, never
-- guest input; without it author.id is bound.
local async = require "sandbox.async"
local errors = require "sandbox.errors"
local lifecycle = require "sandbox.rich._lifecycle"
local media = require "sandbox.rich._media"
local signal = require "sandbox.signal"
local text = require "sandbox.rich._text"

local M = {}

M.MAX_TEXT = 100000
M.MAX_ID = 256
M.MAX_MEMORY = 100000
M.LEVELS = { low = true, medium = true, high = true, xhigh = true }
M.LOG_LINES = 200
M.LOG_CHARS = 200000
M.MESSAGE_CHARS = 4000
M.FAILED = "sandbox turn failed"
M.LOG_BEFORE = "sandbox worker log before removal"
M.LOG_UNAVAILABLE = "sandbox worker log unavailable"

local function fail(msg) error(msg, 0) end

-- Step 3.
local function check_input(t)
  local a = t.author
  if not media.safe_name(t.turnId) or not text.within(t.text, 0, M.MAX_TEXT) or type(a) ~= "table"
      or not text.within(a.id, 0, M.MAX_ID) or not text.within(a.name, 0, M.MAX_ID)
      or (a.principalId ~= nil and not text.within(a.principalId, 1, M.MAX_ID)) then
    fail(errors.RICH_TURN_INPUT)
  end
  local ok, err = media.check_images(t.images)
  if not ok then fail(err) end
end

-- Waits for a task, or fails (errors.RICH_CANCELLED) when sig aborts first.
local function race(task, sig)
  if not async.wait_or_abort(task, sig) then fail(errors.RICH_CANCELLED) end
  if not task.ok then error(task.results[2], 0) end
  return table.unpack(task.results, 2, task.results.n)
end

-- Steps 4-8: the reply, or raises.
local function turn_body(rt, t, c, sig, deadline)
  local o, key = rt.o, t.channel
  local a = t.author
  local principal = a.principalId or a.id
  local judge = async.spawn(o.effort.judge, t.text, { level = c.level })            -- 4
  local start = async.spawn(lifecycle.start, rt, key, t.profile)
  local level = race(judge, sig)
  if type(level) ~= "string" or not M.LEVELS[level] then fail(errors.RICH_EFFORT) end
  c.level = level
  race(start, sig)
  local memory = ""                                                                  -- 5
  if o.memory.promptBlock then
    memory = race(async.spawn(o.memory.promptBlock, key, a.id, a.name, principal), sig)
    if memory == nil then memory = "" end
    if not text.within(memory, 0, M.MAX_MEMORY) then fail(errors.RICH_MEMORY) end
  end
  local images = {}                                                                  -- 6
  for i, img in ipairs(t.images or {}) do images[i] = { data = img.data, mimeType = img.mimeType } end
  local request = {
    turnId = t.turnId, author = { id = a.id, name = a.name, principalId = a.principalId }, text = t.text,
    memory = memory, memoryVisibility = o.memory.visibility, images = images, thinking = level,
  }
  local b = c.broker                                                                 -- 7
  if not b then fail(errors.RICH_NO_BROKER) end
  local release = b:bind {
    channel = key, profile = t.profile, speaker = { id = a.id, name = a.name, principalId = principal },
    thinking = level, signal = sig, deadline = deadline, turnId = t.turnId, record = c.record,
  }
  c.release = release
  local res = b:execute(request, sig)                                                -- 8
  if not res.ok then fail(errors.RICH_WORKER_FAILED .. tostring(res.error)) end
  local files, err = media.decode_files(res.files or {})
  if not files then fail(err) end
  return { ok = true, text = res.text, files = files }
end

-- Step 9's log capture and removal (only for an aborted turn).
local function remove_after_abort(rt, t, c)
  lifecycle.settle_start(c)
  local okp, p = pcall(lifecycle.guarded, rt, t.channel)
  if not okp then return end
  local name = lifecycle.container_name(rt, p)
  if type(rt.driver.logs) == "function" then
    local ok, lines = pcall(rt.driver.logs, name, M.LOG_LINES)
    if ok then
      rt.log.warn(M.LOG_BEFORE, { channel = t.channel, turn = t.turnId, lines = text.scrub(tostring(lines), M.LOG_CHARS) })
    else
      rt.log.warn(M.LOG_UNAVAILABLE, { channel = t.channel, turn = t.turnId, error = text.scrub(text.error_text(lines), 2000) })
    end
  end
  local ok, err = pcall(rt.driver.remove, name)
  if not ok then
    rt.log.error("sandbox container removal failed", { channel = t.channel, turn = t.turnId, error = text.scrub(text.error_text(err), 2000) })
  end
end

-- The turn's one reason (spec/operations.md 4, the sealed turn's closed
-- set), decided by the host from what it saw, and its fix:
--   ok; deadline (turnTimeoutMs); stopped (the caller's signal, stop);
--   the last model call's failure when the worker failed after it
--   (upstream_status, upstream_unreachable, upstream_timeout,
--   upstream_invalid, reflection, credential_missing, credential_error;
--   a model call refused for the spent budget: budget_exhausted);
--   invalid_turn (the host's own turn input was refused); image_missing /
--   daemon_unavailable (the built-in driver's daemon answer); the catalogue
--   entry's reason (image_missing, daemon_unavailable, ...); else
--   worker_failed.
M.INPUT = { [errors.RICH_TURN_INPUT] = true, [errors.RICH_EFFORT] = true, [errors.RICH_MEMORY] = true,
  [errors.RICH_IMAGES] = true, [errors.RICH_IMAGE] = true, [errors.RICH_IMAGE_BUDGET] = true }
M.MODEL_REASONS = { upstream_status = true, upstream_unreachable = true, upstream_timeout = true,
  upstream_invalid = true, reflection = true, credential_missing = true, credential_error = true }

M.UPSTREAM_FIX = require("sandbox.rich.broker._failure").UPSTREAM_FIX

function M.reason(rec, ok, cause, timed_out, cancelled)
  if ok then return "ok" end
  if timed_out then return "deadline", errors.fix(errors.RICH_TIMED_OUT) end
  if cancelled then return "stopped" end
  local m = rec and rec.last_model
  if m and m.reason and M.MODEL_REASONS[m.reason] then
    return m.reason, m.fix or errors.reason_fix(m.reason)
  end
  if m and m.reason == nil and type(m.upstream_status) == "number" and m.upstream_status >= 400 then
    -- 11.5: the worker got the provider's refusal unchanged and failed on it
    rec.upstream = m
    return "upstream_status", M.UPSTREAM_FIX[m.upstream_status] or M.UPSTREAM_FIX.other
  end
  if m and (m.reason == "budget" or m.reason == "busy") then return "budget_exhausted", errors.reason_fix("budget_exhausted") end
  if M.INPUT[cause] then return "invalid_turn", errors.reason_fix("invalid_turn") end
  if type(cause) == "string" and cause:sub(1, #errors.RICH_DOCKER) == errors.RICH_DOCKER then
    -- the built-in driver's view of the daemon (rich/docker.lua): an answer
    -- naming a missing image, or no answer at all
    if cause:find(" failed with 404: ", 1, true) and cause:find("No such image", 1, true) then
      return "image_missing", require("sandbox.runtime.layout").make_fix("image-pi")
    end
    if not cause:find(" failed with %d%d%d: ") then
      return "daemon_unavailable", errors.reason_fix("daemon_unavailable", {})
    end
  end
  local e = errors.entry(cause)
  local reason = e and e.reason or "worker_failed"
  local fix = (e and errors.fix(cause)) or errors.reason_fix(reason)
  if reason == "worker_failed" and not (e and e.fix) then
    fix = "see the worker's log (`docker logs` of the channel's container) and check the image with sbx doctor CONFIG.lua"
  end
  return reason, fix
end

function M.run(rt, t)
  if type(t) ~= "table" or type(t.channel) ~= "string" then
    return { ok = false, error = errors.RICH_TURN_FAILED .. errors.RICH_TURN_INPUT, cause = errors.RICH_TURN_INPUT }
  end
  local c = lifecycle.chan(rt, t.channel)
  if c.active then return { ok = false, error = errors.RICH_BUSY } end             -- 1
  local sig = signal.new()                                                          -- 2
  c.active = { signal = sig }
  local rec = rt.recorder:turn_begin(t.channel, media.safe_name(t.turnId) and t.turnId or nil)
  rec.mode = "rich"
  c.record = rec
  local deadline = rt.clock.now() + rt.o.turnTimeoutMs
  local timed_out = false
  local timer = rt.clock.timer(rt.o.turnTimeoutMs, function()
    if not sig.aborted then timed_out = true end
    sig:abort("timeout")
  end)
  local unhook = t.signal and t.signal.on_abort and t.signal:on_abort(function() sig:abort("cancelled") end)
  local ok, res = pcall(function()
    check_input(t)                                                                  -- 3
    return turn_body(rt, t, c, sig, deadline)
  end)
  if not ok then                                                                    -- 9
    local cause = text.error_text(res)
    local message = text.scrub(cause, M.MESSAGE_CHARS)
    local cancelled = sig.aborted and not timed_out
    rt.log.error(M.FAILED, { channel = t.channel, turn = t.turnId, message = message, timedOut = timed_out, cancelled = cancelled })
    if sig.aborted then remove_after_abort(rt, t, c) end
    res = { ok = false, error = timed_out and errors.RICH_TIMED_OUT or (errors.RICH_TURN_FAILED .. message), cause = cause }
    rec.reason, rec.fix = M.reason(rec, false, cause, timed_out, cancelled)
    rec.error = errors.safe_to_show(cause) and cause or nil
  else
    rec.reason = "ok"
  end
  rec.ok = ok
  c.record = nil
  rt.recorder:turn_end(rec)
  timer:stop()                                                                      -- 10
  if unhook then unhook() end
  sig:abort("turn settled")
  if c.release then c.release() c.release = nil end
  c.active = nil
  return res
end

return M
