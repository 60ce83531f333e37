-- channels/_queue.lua: one FIFO per channel key (spec/runtime.md 5.1), for the
-- callers of the runtime (`sbx chat`, the claim). The runtime itself never
-- queues: it refuses a second concurrent turn on a channel, so whatever
-- feeds it messages orders them here first. Different channels run in
-- parallel; there is no global limit. A job that fails does not stop the
-- jobs queued behind it.
--
-- Guest turns are bounded (shared/spec/hardening.md 4): at most `max`
-- turns (maxQueuedTurns, default 8) wait in a channel's queue, and at most
-- PER_SPEAKER (2) of one speaker; the turn running is no longer queued and
-- does not count. So a flooding guest cannot hold a channel, and an owner's
-- `off` waits for at most that much work. Owner commands are never refused
-- and do not count.
--
--   local q = require("sandbox.channels._queue").new { max = 8 }
--   local task = q:enqueue(channel, fn, ...)   -- starts when its turn comes
--   q:run(channel, fn, ...)                    -- inside a task: wait, return fn's results
--   q:run_turn(channel, speaker_id, fn, ...)   -- the same for a guest turn, or
--                                              -- nil, "queue_full" when over a bound
--   q:size(channel)                            -- jobs queued or running there
--   q:waiting(channel [, speaker_id])          -- guest turns queued, not yet started
--   q:waiting_total()                          -- guest turns waiting, all channels
local async = require "sandbox.async"
local errors = require "sandbox.errors"

local M = {}

M.DEFAULT_MAX = 8
M.MAX_MAX = 1000
M.PER_SPEAKER = 2
M.QUEUE_FULL = "queue_full"

-- maxQueuedTurns (sandbox{}): absent -> the default; else an integer 1-1000.
function M.check_max(value)
  if value == nil then return M.DEFAULT_MAX end
  local n = math.type(value) == "integer" and value
    or (math.type(value) == "float" and value == math.floor(value) and math.tointeger(value)) or nil
  if not n or n < 1 or n > M.MAX_MAX then error(errors.MAX_QUEUED_OPTION, 0) end
  return n
end

local Queue = {}
Queue.__index = Queue

-- opts = {max = maxQueuedTurns} (optional).
function M.new(opts)
  opts = opts or {}
  return setmetatable({
    last = {}, counts = {}, max = opts.max or M.DEFAULT_MAX,
    turn_counts = {},      -- channel -> guest turns waiting (not started)
    speaker_counts = {},   -- channel -> speaker id -> the same, per speaker
  }, Queue)
end

-- Queues fn(...) behind every job already queued on `channel`; returns its
-- task (async.wait(task) gives ok, results...).
function Queue:enqueue(channel, fn, ...)
  local prev = self.last[channel]
  self.counts[channel] = (self.counts[channel] or 0) + 1
  local task = async.spawn(function(...)
    if prev and not prev.done then async.wait(prev) end
    return fn(...)
  end, ...)
  if not task.done then self.last[channel] = task end
  async.on_done(task, function()
    if self.last[channel] == task then self.last[channel] = nil end
    local n = self.counts[channel] - 1
    self.counts[channel] = n > 0 and n or nil
  end)
  return task
end

-- Inside a task: queues fn(...), waits for it and returns its results, or
-- raises its error.
function Queue:run(channel, fn, ...)
  local task = self:enqueue(channel, fn, ...)
  local res = table.pack(async.wait(task))
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

function Queue:waiting(channel, speaker_id)
  if speaker_id == nil then return self.turn_counts[channel] or 0 end
  local per = self.speaker_counts[channel]
  return per and per[speaker_id] or 0
end

-- One turn of `speaker_id` stops waiting (it started, or it never will).
function Queue:_unwait(channel, speaker_id)
  local n = self.turn_counts[channel] - 1
  self.turn_counts[channel] = n > 0 and n or nil
  local per = self.speaker_counts[channel]
  per[speaker_id] = per[speaker_id] - 1
  if per[speaker_id] == 0 then per[speaker_id] = nil end
  if next(per) == nil then self.speaker_counts[channel] = nil end
end

-- Inside a task: a guest turn of `speaker_id`, counted against the bounds
-- while it waits; nil, "queue_full" (nothing queued) when the channel or
-- the speaker already has its bound of turns waiting.
function Queue:run_turn(channel, speaker_id, fn, ...)
  if self:waiting(channel) >= self.max or self:waiting(channel, speaker_id) >= M.PER_SPEAKER then
    return nil, M.QUEUE_FULL
  end
  local per = self.speaker_counts[channel] or {}
  self.speaker_counts[channel] = per
  self.turn_counts[channel] = self:waiting(channel) + 1
  per[speaker_id] = (per[speaker_id] or 0) + 1
  local waiting = true
  local res = table.pack(pcall(self.run, self, channel, function(...)
    waiting = false
    self:_unwait(channel, speaker_id)
    return fn(...)
  end, ...))
  if waiting then self:_unwait(channel, speaker_id) end
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

function Queue:size(channel)
  return self.counts[channel] or 0
end

-- Guest turns waiting in every channel's queue (the metrics'
-- sbx_channel_queue_depth).
function Queue:waiting_total()
  local n = 0
  for _, c in pairs(self.turn_counts) do n = n + c end
  return n
end

return M
