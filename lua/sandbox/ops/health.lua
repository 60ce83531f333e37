-- ops/health.lua: the readiness of a runtime (issue 23 item 3), served as
-- GET /readyz beside /metrics and /healthz (ops/metrics_listen.lua). Ready
-- means a turn could start now: the Docker daemon answers, the worker image
-- is there, the roots are writable, and the descriptor budget has room for
-- one more turn. Nothing here touches a channel, starts a container or
-- writes outside the roots' own probe file.
--
--   local h = health.new(facts)   facts = {daemon=fn, image=fn, writable=fn, descriptors=fn}
--                                 each fn() -> ok, detail[, fix] (may yield)
--   h:check() -> ready, text      (yields; one check runs at a time, and its
--                                 result serves every request for CACHE_MS:
--                                 a flood of /readyz costs one docker call)
--
-- text is one line per check, "ok   NAME  detail" or "FAIL NAME  detail; fix: ...",
-- in the order daemon, image, writable, descriptors.
local async = require "sandbox.async"
local core = require "sandbox.core"

local M = {}

M.CACHE_MS = 2000
M.ORDER = { "daemon", "image", "writable", "descriptors" }

local Health = {}
Health.__index = Health

function M.new(facts)
  return setmetatable({ facts = facts, at = nil, result = nil, task = nil }, Health)
end

local function line(name, ok, detail, fix)
  local s = string.format("%-4s %-11s %s", ok and "ok" or "FAIL", name, tostring(detail or ""))
  if not ok and fix then s = s .. "; fix: " .. fix end
  return s
end

function Health:_run()
  local lines, ready = {}, true
  for _, name in ipairs(M.ORDER) do
    local fn = self.facts[name]
    if fn then
      local ran, ok, detail, fix = pcall(fn)
      if not ran then ok, detail = false, "check failed" end
      ready = ready and ok == true
      lines[#lines + 1] = line(name, ok == true, detail, fix)
    end
  end
  return ready, table.concat(lines, "\n") .. "\n"
end

function Health:check()
  local now = core.now()
  if self.result and now - self.at < M.CACHE_MS then return self.result[1], self.result[2] end
  if not self.task or self.task.done then
    self.task = async.spawn(function()
      local ready, text = self:_run()
      self.result, self.at = { ready, text }, core.now()
      return ready, text
    end)
  end
  local ok, ready, text = async.wait(self.task)
  if not ok then return false, "FAIL readiness check failed\n" end
  return ready, text
end

-- A directory is writable by this process: a probe file created and removed.
function M.writable(dir)
  local probe = dir .. "/.sbx-ready-probe"
  local f = io.open(probe, "wb")
  if not f then return false end
  f:close()
  os.remove(probe)
  return true
end

-- The descriptor budget has room for one more turn (core/fdbudget.c: a
-- turn costs its own descriptors and its guaranteed connections).
M.PER_TURN = core.limits.FD_TURN_COST + core.limits.FD_GUARANTEED_CONNS
function M.descriptor_room()
  local b = core.fd_budget()
  local free = b.limit - b.committed - b.pool_used
  return free >= M.PER_TURN, free, b.limit
end

return M
