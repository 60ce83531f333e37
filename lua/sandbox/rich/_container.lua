-- rich/_container.lua: the long-lived channel container's specification
-- (spec/rich-mode.md 5.2 checks, 5.3's log setting): what any rich driver is
-- handed (5.1's spec), checked before any daemon call. Pure. The settings of
-- 5.3 and their two Docker renderings (the Engine API create body, the
-- `docker create` argv) are drivers/_rich.lua's.
--
--   container.check(spec, log) -> the checked log config {Type, Config}   (raises 5.2's errors)
--   container.log_tag(channel) -> "sandbox/<channel>" with [^A-Za-z0-9_.:/-] as "_"
local errors = require "sandbox.errors"
local render = require "sandbox.drivers._rich"
local runtime_options = require "sandbox.runtime._options"

local M = {}

M.MEMORY, M.NANO_CPUS, M.PIDS, M.NOFILE = render.MEMORY, render.NANO_CPUS, render.PIDS, render.NOFILE
M.TMPFS, M.BASE_URL, M.DUMMY_TOKEN, M.CONTENT = render.TMPFS, render.BASE_URL, render.DUMMY_TOKEN, render.CONTENT
M.LOG_NAME = "^[a-z0-9][a-z0-9_.-]*$"     -- 1-64

local function fail(msg) error(msg, 0) end

function M.log_tag(channel)
  local out = {}
  for _, cp in utf8.codes(channel) do
    local c = cp < 128 and string.char(cp) or ""
    out[#out + 1] = c:find("^[A-Za-z0-9_.:/-]$") and c or "_"
  end
  return "sandbox/" .. table.concat(out)
end

local function log_name_ok(s) return type(s) == "string" and #s <= 64 and s:find(M.LOG_NAME) ~= nil end

local function mount_ok(p)
  return type(p) == "string" and p:sub(1, 1) == "/" and not p:find("^/+$") and not p:find("[:,\r\n%z]")
end

-- The log config of a spec: spec.log, else the driver's log option (a table
-- or a function of the channel), else journald tagged with the channel.
function M.log_config(spec, option)
  local l = spec.log
  if l == nil then
    l = option
    if type(l) == "function" then l = l(spec.channel) end
  end
  if l == nil then
    return { Type = "journald", Config = { tag = M.log_tag(spec.channel) } }
  end
  if type(l) ~= "table" or not log_name_ok(l.driver) then fail(errors.RICH_LOG_DRIVER) end
  local config = {}
  if l.options ~= nil then
    if type(l.options) ~= "table" then fail(errors.RICH_LOG_DRIVER) end
    for k, v in pairs(l.options) do
      if not log_name_ok(k) or type(v) ~= "string" or v:find("[\r\n]") then fail(errors.RICH_LOG_DRIVER) end
      config[k] = v
    end
  end
  return { Type = l.driver, Config = config }
end

function M.name_ok(name)
  return type(name) == "string" and #name <= 91 and name:find("^[a-z0-9][a-z0-9_.-]*$") ~= nil
end

-- 5.2, in the table's order; returns the log config.
function M.check(spec, log_option)
  if type(spec) ~= "table" then fail(errors.RICH_SPEC) end
  local img = spec.image
  if not M.name_ok(spec.name)
      or type(spec.profile) ~= "string" or #spec.profile > 100 or not spec.profile:find("^[a-zA-Z0-9_-]+$")
      or type(img) ~= "string" or img == "" or img:find("%s") or img:sub(1, 1) == "-" then
    fail(errors.RICH_SPEC)
  end
  if math.type(spec.uid) ~= "integer" or math.type(spec.gid) ~= "integer" or spec.uid <= 0 or spec.gid <= 0 then
    fail(errors.RICH_WORKER_ROOT)
  end
  if not mount_ok(spec.runDir) or not mount_ok(spec.workspaceDir) then fail(errors.RICH_MOUNT) end
  if not runtime_options.time_zone_ok(spec.timeZone) then fail(errors.RICH_TIME_ZONE) end
  if type(spec.channel) ~= "string" or not utf8.len(spec.channel) then fail(errors.RICH_SPEC) end
  for _, k in ipairs { "labelChannel", "labelProfile" } do
    if type(spec[k]) ~= "string" or spec[k] == "" then fail(errors.RICH_SPEC) end
  end
  return M.log_config(spec, log_option)
end

return M
