-- async.lua: coroutines on the core's one event loop (OpenResty's cosocket
-- model). Host callbacks are written as sequential Lua; a call that waits
-- (sleep, upstream HTTP, a socket) yields its coroutine and the loop resumes
-- it from the C callback that completes the wait.
--
--   async.spawn(fn, ...)   start fn as a task now; returns the task
--   async.await(register)  inside a task: register(resume) and yield until
--                          resume(...) is called; returns its arguments
--   async.sleep(ms)        inside a task
--   async.sleep_or_abort(ms, sig[, timer])  inside a task: until ms ran out
--                          or sig aborts; true when the wait ran out (timer:
--                          a clock's timer(ms, fn), core.timer by default)
--   async.wait(task)       inside a task: the task's ok, results...
--   async.wait_or_abort(task, sig)  inside a task: until the task finishes
--                          or sig aborts; true when the task finished
--   async.run(fn, ...)     outside any task: spawn fn and drive the loop until
--                          it finishes; returns its results or raises its error
local core = require "sandbox.core"

local M = {}

local pack, unpack = table.pack, table.unpack

local function settle(task, res)
  task.done = true
  task.ok = res[1]
  task.results = res
  local waiters = task.waiters
  task.waiters = nil
  for i = 1, #waiters do waiters[i](task) end
end

-- Starts fn(...) as a coroutine task. Errors are caught and kept in the task
-- (task.ok == false, task.results[2] the error); they never escape a resume.
function M.spawn(fn, ...)
  local task = { done = false, waiters = {} }
  local co = coroutine.create(function(...)
    settle(task, pack(pcall(fn, ...)))
  end)
  task.co = co
  local ok, err = coroutine.resume(co, ...)
  if not ok then settle(task, pack(false, err)) end
  return task
end

-- Calls fn(task) once the task has finished (at once if it already has).
function M.on_done(task, fn)
  if task.done then fn(task) else task.waiters[#task.waiters + 1] = fn end
end

-- Yields the running task until the callback handed to register is called.
-- The callback may be called synchronously, or later from the loop; calls
-- after the first are ignored.
function M.await(register)
  local co, is_main = coroutine.running()
  if is_main then error("async.await: not inside a task (use async.spawn or async.run)", 2) end
  local fired, waiting, early = false, false, nil
  register(function(...)
    if fired then return end
    fired = true
    if waiting then
      local ok, err = coroutine.resume(co, ...)
      if not ok then core.log("error", "task resume failed: " .. tostring(err)) end
    else
      early = pack(...)
    end
  end)
  if fired then return unpack(early, 1, early.n) end
  waiting = true
  return coroutine.yield()
end

function M.sleep(ms)
  return M.await(function(resume) core.timer(ms, resume) end)
end

function M.sleep_or_abort(ms, sig, timer_fn)
  if sig.aborted then return false end
  local timer, unhook
  M.await(function(resume)
    timer = (timer_fn or core.timer)(ms, function() resume() end)
    unhook = sig:on_abort(function() resume() end)
  end)
  timer:stop()
  unhook()
  return not sig.aborted
end

-- Inside a task: waits for another task; returns ok, results...
function M.wait(task)
  if not task.done then
    M.await(function(resume) M.on_done(task, resume) end)
  end
  return unpack(task.results, 1, task.results.n)
end

-- Inside a task: waits until `task` has finished or `sig` has aborted,
-- whichever comes first (the task keeps running after an abort; whoever
-- spawned it decides what an abandoned result means). Returns task.done.
function M.wait_or_abort(task, sig)
  if not task.done and not sig.aborted then
    local unhook
    M.await(function(resume)
      M.on_done(task, function() resume() end)
      unhook = sig:on_abort(function() resume() end)
    end)
    if unhook then unhook() end
  end
  return task.done
end

-- Outside any task: runs fn as a task and drives the loop until it is done.
function M.run(fn, ...)
  local task = M.spawn(fn, ...)
  while not task.done do
    if not core.run("once") and not task.done then
      error("async.run: the task waits on nothing (no active handle)", 2)
    end
  end
  if not task.ok then error(task.results[2], 0) end
  return unpack(task.results, 2, task.results.n)
end

return M
