-- runtime/_disk.lua: one guest must not fill the filesystem every channel
-- shares (shared/spec/hardening.md 3).
--
--   disk.before_turn(o, workspace) -> start   (yields) the checks before a
--       turn: the channel's workspace measured by a bounded, no-follow walk
--       (core.fs_usage: at most MAX_ENTRIES entries, allocated blocks) must
--       be within workspaceQuotaMb (an incomplete walk counts as over it),
--       else `sandbox workspace is over its quota` (workspace_quota); the
--       free space of the filesystems of workspaceRoot and runRoot must be
--       at least diskReserveMb, else `sandbox disk space is below
--       diskReserveMb` (disk_low). start = {size, used} for the watchdog.
--   disk.watchdog(o) -> wd            while any turn runs, every TICK_MS it
--       statfs-es the filesystems of workspaceRoot and runRoot and of each
--       running turn's workspace (a turn may write ~1.4 GB/s): a turn whose
--       workspace filesystem grew by more than workspaceQuotaMb since it
--       started, or by more than GROWTH_SLACK while free space is below the
--       reserve, has every running turn's workspace measured again, and a
--       turn whose own workspace grew past that rule is stopped with
--       `sandbox workspace is over its quota`.
--     wd:add(turn, workspace, start)   wd:remove(turn)   wd:stop()
-- Neither replaces an operator's filesystem quota (README: an XFS project
-- quota or a loop image per workspace).
local async = require "sandbox.async"
local core = require "sandbox.core"
local errors = require "sandbox.errors"

local M = {}

M.MAX_ENTRIES = 100000
M.QUICK_ENTRIES = 256       -- measured at once, without yielding (the usual workspace)
M.TICK_MS = 100
M.MIB = 1048576
-- What an honest worker's own writes add to a workspace in one turn: memory
-- (512 KiB) and history, each with its tmp copy during the atomic write.
M.GROWTH_SLACK = 2 * M.MIB

local function fail(msg) error(msg, 0) end

-- The workspace's allocated bytes, or nil when the walk was incomplete or
-- failed. A workspace of at most QUICK_ENTRIES entries is measured at once;
-- a larger one in the threadpool (yields), so a hostile tree never holds the
-- loop.
function M.usage(path)
  local r = core.fs_usage(path, M.QUICK_ENTRIES)
  if not r.error and not r.complete then
    r = async.await(function(resume) core.fs_usage(path, M.MAX_ENTRIES, resume) end)
  end
  if r.error or not r.complete then return nil end
  return r.bytes
end

local function below_reserve(o)
  if o.diskReserveMb <= 0 then return false end
  local reserve = o.diskReserveMb * M.MIB
  for _, root in ipairs { o.workspaceRoot, o.runRoot } do
    local s = core.fs_statfs(root)
    if s and s.free < reserve then return true end
  end
  return false
end
M.below_reserve = below_reserve

function M.before_turn(o, workspace)
  local size = M.usage(workspace)
  if size == nil or size > o.workspaceQuotaMb * M.MIB then fail(errors.WORKSPACE_QUOTA) end
  if below_reserve(o) then fail(errors.DISK_LOW) end
  local s = core.fs_statfs(workspace)
  return { size = size, used = s and s.used or 0 }
end

local Watchdog = {}
Watchdog.__index = Watchdog

function M.watchdog(o)
  return setmetatable({ o = o, turns = {}, count = 0 }, Watchdog)
end

local function over_quota(turn)
  if not turn.signal.aborted then turn.signal:abort(errors.WORKSPACE_QUOTA) end
end

-- With several turns running: measure each workspace again and stop those
-- that grew past the rule (one measuring task at a time).
function Watchdog:_attribute(low, quota)
  if self.measuring then return end
  local list = {}
  for turn, w in pairs(self.turns) do list[#list + 1] = { turn, w } end
  self.measuring = true          -- cleared by the task, even when it never yields
  async.spawn(function()
    for _, e in ipairs(list) do
      local turn, w = e[1], e[2]
      if self.turns[turn] and not turn.signal.aborted then
        local size = M.usage(w.workspace)
        local grew = size == nil and math.huge or size - w.start.size
        if grew > quota or (low and grew > M.GROWTH_SLACK) then over_quota(turn) end
      end
    end
    self.measuring = nil
  end)
end

-- One look at the disk: a turn whose workspace filesystem grew past the
-- rule makes every running turn's workspace be measured again, and those
-- that grew past it themselves are stopped (another writer on the same
-- filesystem never stops a turn).
function Watchdog:tick()
  if self.count == 0 then return end
  local o = self.o
  local quota = o.workspaceQuotaMb * M.MIB
  local low = below_reserve(o)
  for _, w in pairs(self.turns) do
    local s = core.fs_statfs(w.workspace)
    local grew = s and (s.used - w.start.used) or 0
    if grew > quota or (low and grew > M.GROWTH_SLACK) then
      self:_attribute(low, quota)
      return
    end
  end
end

function Watchdog:_arm()
  if self.timer then return end
  local function fire()
    self.timer = nil
    if self.count == 0 then return end
    self:tick()
    self:_arm()
  end
  self.timer = core.timer(M.TICK_MS, fire)
end

function Watchdog:add(turn, workspace, start)
  if self.turns[turn] == nil then self.count = self.count + 1 end
  self.turns[turn] = { workspace = workspace, start = start }
  self:_arm()
end

function Watchdog:remove(turn)
  if self.turns[turn] == nil then return end
  self.turns[turn] = nil
  self.count = self.count - 1
  if self.count == 0 then self:stop() end
end

function Watchdog:stop()
  if self.timer then
    self.timer:stop()
    self.timer = nil
  end
end

return M
