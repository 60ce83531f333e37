-- ops/process.lua: the engine process's own metrics (issue 23 item 6), the
-- families every Prometheus exporter has, added to a registry by
-- ops/metrics.lua and read at every scrape:
--   sbx_build_info{version}             1, with the release (core.version)
--   process_start_time_seconds           when this process loaded the engine (Unix time)
--   process_open_fds                     descriptors open now (/proc/self/fd)
--   process_resident_memory_bytes        resident memory now (/proc/self/status VmRSS)
--   process_max_fds                      the soft RLIMIT_NOFILE the host runs with
local core = require "sandbox.core"

local M = {}

M.STARTED = os.time()            -- the engine's first load, the process's start in practice

local function version_label(v)
  return type(v) == "string" and #v <= 64 and not v:find("[%c\"\\]") and v or nil
end

function M.resident_bytes()
  local f = io.open("/proc/self/status", "r")
  if not f then return nil end
  local text = f:read(8192)
  f:close()
  local kb = text and text:match("\nVmRSS:%s*(%d+) kB")
  return kb and tonumber(kb) * 1024 or nil
end

local function emit_value(read)
  return function(emit)
    local v = read()
    if v then emit(nil, v) end
  end
end

function M.register(reg)
  reg:gauge("sbx_build_info", "The engine's release, as a label; always 1.", { version = version_label },
    function(emit) emit({ version = core.version }, 1) end)
  reg:gauge("process_start_time_seconds", "Start time of the process since the Unix epoch, in seconds.", nil,
    function(emit) emit(nil, M.STARTED) end)
  reg:gauge("process_open_fds", "Number of open file descriptors.", nil,
    emit_value(function() local n = core.fd_count() return n and n >= 0 and n or nil end))
  reg:gauge("process_max_fds", "Maximum number of open file descriptors (the soft limit).", nil,
    emit_value(function() local b = core.fd_budget() return b and b.limit or nil end))
  reg:gauge("process_resident_memory_bytes", "Resident memory size in bytes.", nil, emit_value(M.resident_bytes))
end

return M
