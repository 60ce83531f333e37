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
--       diskReserveMb` (disk_low). start = {size, used, room} for the
--       watchdog.
--   disk.watchdog(o) -> wd            while any turn runs, at least every
--       TICK_MS it statfs-es the filesystems of workspaceRoot and runRoot and
--       of each running turn's workspace, and sooner when little room is left
--       above the reserve (tick_delay: a turn writing MAX_WRITE_RATE may use
--       at most 1/ROOM_SHARE of that room between two looks; never more
--       often than every MIN_TICK_MS): a turn whose
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
M.TICK_MS = 100             -- the longest time between two looks (hardening.md 3)
M.MIN_TICK_MS = 10          -- the shortest
-- The fastest a turn has been seen writing a workspace, in bytes per second:
-- ~1.4 GB/s to a real disk (hardening.md 3), and up to ~4 GiB/s into the
-- page cache, which is where a burst lands first (hostile_spec.lua's fill on
-- a 512 MiB loop filesystem: 20 MiB per 5 ms, ~245 MiB before writeback
-- throttles it, so a 100 ms look let half that filesystem go unseen).
M.MAX_WRITE_RATE = 4096 * 1048576
M.ROOM_SHARE = 8
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

local function reserve_of(o) return math.max(o.diskReserveMb, 0) * M.MIB end

-- The smallest room above the reserve (free space for the service account
-- minus diskReserveMb; below zero under the reserve) on the filesystems of
-- workspaceRoot and runRoot; math.huge when neither could be statfs-ed.
local function roots_room(o)
  local reserve, room = reserve_of(o), math.huge
  for _, root in ipairs { o.workspaceRoot, o.runRoot } do
    local s = core.fs_statfs(root)
    if s then room = math.min(room, s.free - reserve) end
  end
  return room
end

local function below_reserve(o)
  return o.diskReserveMb > 0 and roots_room(o) < 0
end
M.below_reserve = below_reserve

-- Milliseconds until the watchdog's next look with `room` bytes left above
-- the reserve: a turn writing MAX_WRITE_RATE uses at most 1/ROOM_SHARE of
-- it meanwhile, so the look and the stop that follows it (the container's
-- removal) come before the filesystem fills; TICK_MS on a roomy disk (3.2
-- GiB of room and more), never below MIN_TICK_MS.
function M.tick_delay(room)
  local ms = math.min(M.TICK_MS, math.max(room, 0) * 1000 / (M.MAX_WRITE_RATE * M.ROOM_SHARE))
  return math.max(M.MIN_TICK_MS, math.floor(ms))
end

-- start.room: the room above the reserve, for the watchdog's first look.
function M.before_turn(o, workspace)
  local size = M.usage(workspace)
  if size == nil or size > o.workspaceQuotaMb * M.MIB then fail(errors.WORKSPACE_QUOTA) end
  local room = roots_room(o)
  if o.diskReserveMb > 0 and room < 0 then fail(errors.DISK_LOW) end
  local s = core.fs_statfs(workspace)
  if s then room = math.min(room, s.free - reserve_of(o)) end
  return { size = size, used = s and s.used or 0, room = room }
end

local Watchdog = {}
Watchdog.__index = Watchdog

function M.watchdog(o)
  return setmetatable({ o = o, turns = {}, count = 0, room = math.huge }, Watchdog)
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
-- filesystem never stops a turn). Keeps the smallest room it saw for the
-- next look's delay.
function Watchdog:tick()
  if self.count == 0 then return end
  local o = self.o
  local quota, reserve = o.workspaceQuotaMb * M.MIB, reserve_of(o)
  local room = roots_room(o)
  local low = o.diskReserveMb > 0 and room < 0
  local over = false
  for _, w in pairs(self.turns) do
    local s = core.fs_statfs(w.workspace)
    if s then room = math.min(room, s.free - reserve) end
    local grew = s and (s.used - w.start.used) or 0
    if grew > quota or (low and grew > M.GROWTH_SLACK) then over = true end
  end
  self.room = room
  if over then self:_attribute(low, quota) end
end

-- The next look in `ms`, unless one is already due sooner.
function Watchdog:_arm(ms)
  local due = core.now() + ms
  if self.timer then
    if self.due <= due then return end
    self.timer:stop()
  end
  local function fire()
    self.timer = nil
    if self.count == 0 then return end
    self:tick()
    self:_arm(M.tick_delay(self.room))
  end
  self.due = due
  self.timer = core.timer(ms, fire)
end

-- A turn is watched from before its container starts; the first look comes
-- as soon as the room its before_turn saw asks.
function Watchdog:add(turn, workspace, start)
  if self.turns[turn] == nil then self.count = self.count + 1 end
  self.turns[turn] = { workspace = workspace, start = start }
  self:_arm(M.tick_delay(start.room or math.huge))
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
