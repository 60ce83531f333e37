-- runtime/_installation.lua: who owns a pair of sandbox roots, and the stale
-- containers a crashed owner left behind (spec/runtime.md 6).
--
--   installation.lock(run_root)        -> lock, or raises E_LOCKED (6.1)
--   installation.try_lock(run_root)    -> lock | nil, "busy" | nil, err
--   installation.id(workspace_root, run_root) -> 64 hex (6.2; canonical roots)
--   installation.owner_id()            -> "<bootId>:<pid>:<startTicks>" of this process
--   installation.owner_live(owner)     -> true when that process still runs (6.2)
--   installation.sweep(o)              -> removed count, or raises E_CLEANUP (6.3)
--   installation.stale(list, o)        -> the sweep's decisions, pure
--
-- The lock is a flock on the canonical run root itself, opened read-only and
-- close-on-exec (core.lock_dir): no file is created, the kernel drops it
-- when the process dies, and no docker child inherits it.
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local errors = require "sandbox.errors"

local M = {}

M.E_LOCKED = errors.LOCKED
M.E_CLEANUP = errors.CLEANUP
M.TURN_DIR_PATTERN = "^turn%-[A-Za-z0-9][A-Za-z0-9][A-Za-z0-9][A-Za-z0-9][A-Za-z0-9][A-Za-z0-9]$"
M.LOG_REMOVED = "removed stale sandbox containers"
M.LOG_FAILED = "stale sandbox containers could not be removed; run sbx cleanup"
M.LOG_ODD_NAME = "labelled container with an unexpected name left alone"
M.LOG_ODD_ENTRY = "unexpected run root entry left alone"

local function fail(msg) error(msg, 0) end

local function read_file(path, max)
  local f = io.open(path, "rb")
  if not f then return nil end
  local data = f:read(max or 4096)
  f:close()
  return data
end

-- 6.1: exclusive non-blocking flock on the run root directory.
function M.try_lock(run_root)
  local lock, err, code = core.lock_dir(run_root)
  if not lock then return nil, code == "EAGAIN" and "busy" or err end   -- EAGAIN: another holder
  return lock
end

function M.lock(run_root)
  local lock = M.try_lock(run_root)
  if not lock then fail(M.E_LOCKED) end
  return lock
end

-- 6.2: SHA-256 of canonical workspaceRoot, one NUL, canonical runRoot.
function M.id(workspace_root, run_root)
  return core.sha256_hex(workspace_root .. "\0" .. run_root)
end

-- The kernel's per-boot id (36 characters), or nil.
function M.boot_id()
  local s = read_file("/proc/sys/kernel/random/boot_id", 64)
  s = s and s:match("^(%x[%x%-]+%x)%s*$")
  if s and #s == 36 then return s end
  return nil
end

-- Field 22 of /proc/<pid>/stat (start time in clock ticks after boot), read
-- after the last ')' so a command name with spaces or parentheses cannot
-- shift the fields. nil when there is no such process.
function M.start_ticks(pid)
  local s = read_file("/proc/" .. tostring(pid) .. "/stat", 4096)
  if not s then return nil end
  local rest = s:match("^.*%)(.*)$")
  if not rest then return nil end
  local fields = {}
  for f in rest:gmatch("%S+") do fields[#fields + 1] = f end
  -- rest starts at field 3 (state); field 22 is rest's 20th
  local v = fields[20]
  return v and v:find("^%d+$") and v or nil
end

local owner_cache
function M.owner_id()
  if owner_cache then return owner_cache end
  local boot, pid = M.boot_id(), core.getpid()
  local ticks = M.start_ticks(pid)
  if not boot or not ticks then error("cannot read this process's boot id and start time", 0) end
  owner_cache = boot .. ":" .. pid .. ":" .. ticks
  return owner_cache
end

-- Parses "<bootId>:<pid>:<startTicks>"; nil for anything else.
function M.parse_owner(owner)
  if type(owner) ~= "string" then return nil end
  local boot, pid, ticks = owner:match("^([%x%-]+):(%d+):(%d+)$")
  if not boot or #boot ~= 36 or #pid > 10 then return nil end
  return { boot = boot, pid = tonumber(pid), ticks = ticks }
end

-- Live: same boot, and a process with that pid whose start time matches.
function M.owner_live(owner, probe)
  probe = probe or M
  local o = M.parse_owner(owner)
  if not o then return false end
  if o.boot ~= probe.boot_id() then return false end
  local t = probe.start_ticks(o.pid)
  return t ~= nil and t == o.ticks
end

-- The sweep's decisions (6.3 step 2, 6.4): for each listed container,
-- {name, owner, stale=bool, removable=bool}. o.mode:
--   "owner"  (the lock is held by this runtime): every container whose
--            owner is not o.self is stale
--   "free"   (sbx cleanup took the lock): every container is stale
--   "busy"   (sbx cleanup, a live host holds the lock): stale only when the
--            owner is gone (o.live(owner) false)
-- A stale container is removable only when its name matches 4.4.
function M.stale(list, o)
  local out = {}
  for _, c in ipairs(list) do
    local stale
    if o.mode == "free" then
      stale = true
    elseif o.mode == "busy" then
      stale = not (o.live or M.owner_live)(c.owner)
    else
      stale = c.owner ~= o.self
    end
    out[#out + 1] = {
      name = c.name, owner = c.owner, stale = stale,
      removable = stale and container.name_valid(c.name),
    }
  end
  return out
end

local function default_log(level, msg, fields)
  if fields and fields.count then msg = msg .. " (count " .. fields.count .. ")" end
  core.log(level, msg)
end

-- Leftover turn directories in the run root that no active turn uses
-- (6.3 step 3). Returns true when every one could be removed.
function M.remove_turn_dirs(run_root, active, log)
  local names = core.fs_readdir(run_root)
  if not names then return false end
  local ok = true
  for _, name in ipairs(names) do
    if name:find(M.TURN_DIR_PATTERN) then
      if not (active and active[name]) then
        if not core.fs_rmtree(run_root .. "/" .. name) then ok = false end
      end
    elseif log then
      log("info", M.LOG_ODD_ENTRY)
    end
  end
  return ok
end

-- 6.3: o = {driver, installation, self (owner id), run_root, active (set of
-- turn-dir names in use), log(level, msg, fields)}. Returns the number of
-- containers removed; raises E_CLEANUP when the list or any removal failed
-- (after trying every removal). Yields (driver calls).
function M.sweep(o)
  local log = o.log or default_log
  local driver = o.driver
  local ok, list = pcall(driver.list, driver, o.installation)
  if not ok or type(list) ~= "table" then
    -- a daemon that does not answer is its own reason: `sbx cleanup` could
    -- not work either, so the cleanup line would send the operator astray
    if o.daemon_down and o.daemon_down() then fail(errors.DAEMON) end
    log("error", M.LOG_FAILED)
    fail(M.E_CLEANUP)
  end
  local removed, failed = 0, false
  for _, c in ipairs(M.stale(list, { mode = "owner", self = o.self or M.owner_id() })) do
    if c.removable then
      if pcall(driver.remove, driver, c.name) then removed = removed + 1 else failed = true end
    elseif not container.name_valid(c.name) then
      log("info", M.LOG_ODD_NAME)
    end
  end
  -- A turn directory that cannot be removed is logged, not fatal: it holds
  -- no container and must not block every later turn.
  if o.run_root and not M.remove_turn_dirs(o.run_root, o.active, log) then
    log("error", "leftover turn directories could not be removed")
  end
  if removed > 0 then log("info", M.LOG_REMOVED, { count = removed }) end
  if failed then
    log("error", M.LOG_FAILED)
    fail(M.E_CLEANUP)
  end
  return removed
end

return M
