-- rich/_turn.lua: rt:runTurn{channel, profile, turnId, author={id, name,
-- principalId?}, text, images, signal?} (spec/rich-mode.md 7) -> {ok=true,
-- text, files={{name, data=<bytes>}}} or {ok=false, error, cause}. One turn
-- per channel at a time. Identity is bound to the channel's broker
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
    thinking = level, signal = sig, deadline = deadline, turnId = t.turnId,
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
      rt.log.warn(M.LOG_BEFORE, { channel = t.channel, turnId = t.turnId, lines = text.scrub(tostring(lines), M.LOG_CHARS) })
    else
      rt.log.warn(M.LOG_UNAVAILABLE, { channel = t.channel, turnId = t.turnId, error = text.scrub(text.error_text(lines), 2000) })
    end
  end
  local ok, err = pcall(rt.driver.remove, name)
  if not ok then
    rt.log.error("sandbox container removal failed", { channel = t.channel, turnId = t.turnId, error = text.scrub(text.error_text(err), 2000) })
  end
end

function M.run(rt, t)
  if type(t) ~= "table" or type(t.channel) ~= "string" then
    return { ok = false, error = errors.RICH_TURN_FAILED .. errors.RICH_TURN_INPUT, cause = errors.RICH_TURN_INPUT }
  end
  local c = lifecycle.chan(rt, t.channel)
  if c.active then return { ok = false, error = errors.RICH_BUSY } end             -- 1
  local sig = signal.new()                                                          -- 2
  c.active = { signal = sig }
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
    rt.log.error(M.FAILED, { channel = t.channel, turnId = t.turnId, message = message, timedOut = timed_out, cancelled = cancelled })
    if sig.aborted then remove_after_abort(rt, t, c) end
    res = { ok = false, error = timed_out and errors.RICH_TIMED_OUT or (errors.RICH_TURN_FAILED .. message), cause = cause }
  end
  timer:stop()                                                                      -- 10
  if unhook then unhook() end
  sig:abort("turn settled")
  if c.release then c.release() c.release = nil end
  c.active = nil
  return res
end

return M
