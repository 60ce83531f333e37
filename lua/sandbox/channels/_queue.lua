-- channels/_queue.lua: one FIFO per channel key (spec/runtime.md 5.1), for the
-- callers of the runtime (`sbx chat`, the claim). The runtime itself never
-- queues: it refuses a second concurrent turn on a channel, so whatever
-- feeds it messages orders them here first. Different channels run in
-- parallel; there is no global limit. A job that fails does not stop the
-- jobs queued behind it.
--
--   local q = require("sandbox.channels._queue").new()
--   local task = q:enqueue(channel, fn, ...)   -- starts when its turn comes
--   q:run(channel, fn, ...)                    -- inside a task: wait, return fn's results
--   q:size(channel)                            -- jobs queued or running there
local async = require "sandbox.async"

local M = {}

local Queue = {}
Queue.__index = Queue

function M.new()
  return setmetatable({ last = {}, counts = {} }, Queue)
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

function Queue:size(channel)
  return self.counts[channel] or 0
end

return M
