-- rich/_log.lua: the host logger of rich mode (spec/rich-mode.md 18). The
-- operator's logger is a table of info/warn/error functions called as
-- (message, fields); without one, each line is a JSON object on stderr
-- {"time","level","msg",...fields}. A logger that raises never breaks a turn
-- or a call. No payload or credential is ever a field: callers pass names,
-- statuses, counts and text that went through redact + scrubDiagnostic.
--
--   log.new(logger) -> L;  L.info(msg, fields), L.warn(...), L.error(...)
--   log.upstream_failure(L, fields, ...tokens)   11.6 "sandbox upstream call failed"
local json = require "sandbox.json"
local text = require "sandbox.rich._text"

local M = {}

M.UPSTREAM_FAILED = "sandbox upstream call failed"
M.BODY_CHARS = 2000

local function stderr_line(level, msg, fields)
  local names, values = { "time", "level", "msg" }, { time = os.date("!%Y-%m-%dT%H:%M:%SZ"), level = level, msg = msg }
  local extra = {}
  for k in pairs(fields or {}) do if type(k) == "string" and values[k] == nil then extra[#extra + 1] = k end end
  table.sort(extra)
  for _, k in ipairs(extra) do names[#names + 1] = k values[k] = json.value(fields[k]) end
  local line = json.encode(json.object(names, values))
  if line then io.stderr:write(line, "\n") end
end

function M.new(logger)
  local L = {}
  for _, level in ipairs { "info", "warn", "error" } do
    local fn = logger and logger[level]
    L[level] = function(msg, fields)
      if fn then
        local ok = pcall(fn, msg, fields or {})
        if ok then return end
      end
      stderr_line(level, msg, fields)
    end
  end
  return L
end

-- 11.6: fields = {channel, upstream, latencyMs, status?, body?, error?};
-- body and error lose every form of every token, then scrubDiagnostic(2000).
function M.upstream_failure(L, f, ...)
  local out = { channel = f.channel, upstream = f.upstream, latencyMs = f.latencyMs, status = f.status }
  if f.body ~= nil then out.body = text.scrub(text.redact(f.body, ...), M.BODY_CHARS) end
  if f.error ~= nil then out.error = text.scrub(text.redact(text.error_text(f.error), ...), M.BODY_CHARS) end
  L.warn(M.UPSTREAM_FAILED, out)
end

return M
