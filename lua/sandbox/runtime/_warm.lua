-- runtime/_warm.lua: the warm pool (spec/warm-turns.md). After a turn of a
-- channel settled and its container was confirmed removed, the channel's
-- next container is created and started here, fresh, blocked on its stdin,
-- with an unbound broker (503 `broker not ready` until its turn binds it);
-- a turn of that channel then only binds the broker and writes its message
-- (runtime/init.lua). A container serves one turn and is removed after
-- delivery, in the background, overlapped with the next warm start.
--
--   local pool = warm.new(rt)
--   pool.enabled                        warm.channels > 0 and a driver of
--                                       drivers/contract.lua primitives
--   pool:take(channel, sig) -> e | nil  (yields) the channel's warm container,
--                                       now the turn's (nil: run cold)
--   pool:settle(channel, sig)           (yields) every earlier container of
--                                       the channel confirmed removed; raises
--                                       the cleanup error while one could not be
--   pool:finish(e, fn)                  after delivery: fn() (exit status and
--                                       removal; raises the removal error), then
--                                       the broker, the turn dir, the charge;
--                                       then the channel's next warm start
--   pool:drop(e)                        a taken entry whose turn never reached
--                                       it: removed like an evicted one
--   pool:refill(channel, workspace)     start the channel's next container
--   pool:refill_soon(channel, workspace)   the same on the next loop turn
--   pool:blocked_by(channel, name)      a cold container whose removal failed
--   pool:cool(channel)                  remove the channel's warm container
--   pool:evict_other(channel) -> bool   give back a charge (descriptors)
--   pool:dispose()                      (yields) everything removed
--   pool:counts() -> {warm=, removing=}
--
-- An entry holds a descriptor charge (core.fd_turn_acquire) from its start
-- to its removal; the turn that takes it uses that charge. A warm start that
-- finds no charge, no slot or a failure leaves the channel cold. Nothing
-- here fails a turn except a removal that could not be confirmed.
local async = require "sandbox.async"
local broker = require "sandbox.broker"
local container = require "sandbox.drivers._sealed"
local contract = require "sandbox.drivers.contract"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local signal = require "sandbox.signal"

local M = {}

M.LOG_LOST = "warm container lost"
M.LOG_REMOVAL_FAILED = "a warm container could not be removed; the channel's next turn is refused until it is"
M.LOG_FAULT = "worker exited non-zero after a valid reply"
M.EVICTED = "warm container evicted"
M.EXIT_WAIT_MS = 2000     -- a delivered turn's exit status, then it is removed anyway

local Pool = {}
Pool.__index = Pool

local function warm_driver(d)
  return type(d) == "table" and type(d.create) == "function" and type(d.start) == "function"
    and type(d.feed) == "function" and type(d.read) == "function" and type(d.wait_within) == "function"
    and type(d.remove_once) == "function"
end

function M.new(rt)
  local w = rt.options.warm
  return setmetatable({
    rt = rt, cap = w.channels, idle_ms = w.idleMs,
    enabled = w.channels > 0 and warm_driver(rt.driver),
    entries = {},     -- channel -> entry (starting or ready)
    draining = {},    -- channel -> task: removals of that channel's containers
    blocked = {},     -- channel -> container name whose removal failed
    n_draining = 0,
    soon = {},        -- channel -> timer of a refill on the next loop turn
  }, Pool)
end

function Pool:counts()
  local n = 0
  for _ in pairs(self.entries) do n = n + 1 end
  return { warm = n, removing = self.n_draining }
end

local function stop_idle(e)
  if e.idle then e.idle:stop(); e.idle = nil end
end

-- Runs fn in the background as one of the channel's removals: the next
-- settle of that channel waits for it (and for the ones before it).
function Pool:_drain(channel, fn)
  local before = self.draining[channel]
  self.n_draining = self.n_draining + 1
  local task
  task = async.spawn(function()
    if before and not before.done then async.wait(before) end
    local ok, err = pcall(fn)
    self.n_draining = self.n_draining - 1
    if self.draining[channel] == task then self.draining[channel] = nil end
    if not ok then error(err, 0) end
  end)
  if not task.done then self.draining[channel] = task end
  return task
end

-- The container, broker, turn dir and charge of an entry, removed; the
-- container by the removal algorithm of 4.7 unless `container_gone` (the
-- turn's own removal confirmed it); raises the cleanup error.
function Pool:_remove(e, container_gone)
  local rt, d = self.rt, self.rt.driver
  local ok, err = pcall(function()
    if e.name and not container_gone then contract.remove(d, e.name) end
  end)
  if e.broker then e.broker:stop() end
  if e.run_dir then rt:_remove_run_dir({ channel = e.channel, record = { turn = e.turn_id } }, e.run_dir) end
  if e.charged then e.charged = false; core.fd_turn_release() end
  if not ok then
    self.blocked[e.channel] = e.name
    rt.recorder:cleanup { ok = false, scope = "warm" }
    rt.logger:error(M.LOG_REMOVAL_FAILED, { channel = e.channel,
      fix = errors.fix(errors.CLEANUP, rt:fix_context()) })
    error(err, 0)
  end
end

-- Ends an entry that never served a turn (idle, LRU, lost, dispose, cool,
-- a turn that never reached it): it leaves the pool at once, its removal is
-- one of the channel's drains.
function Pool:_evict(e, why)
  if e.state == "gone" then return end
  e.state = "gone"
  if self.entries[e.channel] == e then self.entries[e.channel] = nil end
  stop_idle(e)
  e.ws:abort(why or M.EVICTED)
  self:_drain(e.channel, function()
    if e.task and not e.task.done then async.wait(e.task) end
    if e.h then self.rt.driver:release(e.h) end
    if e.read and not e.read.done then async.wait(e.read) end
    self:_remove(e)
  end)
end

function Pool:drop(e)
  self:_evict(e, M.EVICTED)
end

-- The channel's container ready to start, or why not (logged by refill).
function Pool:_start(e, workspace)
  local rt = self.rt
  local run_dir = rt:_new_run_dir()
  e.run_dir = run_dir
  local socket = run_dir .. "/broker.sock"
  if #socket > broker.MAX_SOCKET_PATH then error(broker.SOCKET_TOO_LONG, 0) end
  e.broker = broker.unbound(rt.cfg, { channel = e.channel, recorder = rt.recorder })
  e.turn_id = e.broker.turn_id
  local started = e.broker:start(socket)
  if not started then error(errors.BROKER_START, 0) end
  if e.state == "gone" then return end
  local c = container.check(rt:_container_spec({ channel = e.channel }, run_dir, workspace))
  e.c, e.name = c, c.name
  e.since = os.time() - 1
  e.h = contract.launch(rt.driver, c, e.ws, nil, contract.MAX_STDOUT)
  -- stdout to its end: the turn's reply, or a container lost before its turn
  e.read = async.spawn(rt.driver.read, rt.driver, e.h)
  async.on_done(e.read, function()
    if e.state == "starting" or e.state == "ready" then
      rt.logger:warn(M.LOG_LOST, { channel = e.channel })
      self:_evict(e, M.LOG_LOST)
    end
  end)
end

-- The least recently used entry not of `channel`, or nil.
function Pool:_lru(except)
  local best
  for ch, e in pairs(self.entries) do
    if ch ~= except and (best == nil or e.used_at < best.used_at) then best = e end
  end
  return best
end

function Pool:refill(channel, workspace)
  local rt = self.rt
  if not self.enabled or rt.disposed or not rt.sweep_ok or self.entries[channel] or self.blocked[channel]
      or self.draining[channel] or rt.active[channel] then
    return
  end
  if self:counts().warm >= self.cap then
    local old = self:_lru(channel)
    if not old then return end
    self:_evict(old, M.EVICTED)
  end
  if not core.fd_turn_acquire() then return end
  local e = { channel = channel, state = "starting", ws = signal.new(), used_at = core.now(), charged = true }
  self.entries[channel] = e
  e.task = async.spawn(function()
    local ok = pcall(self._start, self, e, workspace)
    if e.state ~= "starting" then return end
    if not ok or (e.read and e.read.done) then
      rt.logger:warn(M.LOG_LOST, { channel = channel })
      self:_evict(e, M.LOG_LOST)
      return
    end
    e.state = "ready"
    e.idle = core.timer(self.idle_ms, function()
      e.idle = nil
      self:_evict(e, "idle")
    end)
  end)
end

-- refill on the next loop turn: a caller that disposes right after its
-- last turn (sbx run, a script) starts no container it would remove again.
function Pool:refill_soon(channel, workspace)
  if not self.enabled or self.soon[channel] then return end
  self.soon[channel] = core.timer(0, function()
    self.soon[channel] = nil
    self:refill(channel, workspace)
  end)
end

function Pool:take(channel, sig)
  local e = self.entries[channel]
  if not e then return nil end
  if e.state == "starting" then async.wait_or_abort(e.task, sig) end
  if sig.aborted or e.state ~= "ready" or self.entries[channel] ~= e then return nil end
  e.state = "taken"
  self.entries[channel] = nil
  stop_idle(e)
  return e
end

function Pool:settle(channel, sig)
  while self.draining[channel] do
    local t = self.draining[channel]
    async.wait_or_abort(t, sig)
    if sig.aborted then error(sig.reason, 0) end
    if self.draining[channel] == t then self.draining[channel] = nil end
  end
  local name = self.blocked[channel]
  if name then
    local ok = pcall(contract.remove, self.rt.driver, name)
    if not ok then error(self.rt:_cleanup_error(), 0) end
    self.blocked[channel] = nil
  end
end

function Pool:blocked_by(channel, name)
  if self.enabled and name then self.blocked[channel] = name end
end

function Pool:finish(e, fn, workspace)
  e.state = "gone"
  local task = self:_drain(e.channel, function()
    local ok = pcall(fn)
    e.ws:abort("settled")
    -- fn removed the container; when it could not, _remove tries the
    -- algorithm once more and blocks the channel if that fails too
    self:_remove(e, ok)
  end)
  async.on_done(task, function()
    if task.ok ~= false and not e.no_refill then self:refill_soon(e.channel, workspace) end
  end)
end

function Pool:cool(channel)
  local e = self.entries[channel]
  if e then self:_evict(e, M.EVICTED) end
end

function Pool:evict_other(channel)
  local e = self:_lru(channel)
  if not e then return false end
  self:_evict(e, M.EVICTED)
  return true
end

function Pool:dispose()
  for ch, t in pairs(self.soon) do t:stop(); self.soon[ch] = nil end
  for _, e in pairs(self.entries) do self:_evict(e, M.EVICTED) end
  while next(self.draining) do
    local ch, t = next(self.draining)
    async.wait(t)
    if self.draining[ch] == t then self.draining[ch] = nil end
  end
end

return M
