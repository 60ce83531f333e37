-- rich/_log.lua: rich mode's face of the engine's one operator logger
-- (sandbox/log.lua, spec/operations.md 2) and of its call records
-- (sandbox/ops/record.lua, the audit lines of operations.md 3). Every line
-- rich mode writes, the messages of spec/rich-mode.md 18 and the broker's
-- audit lines, goes through one sandbox.log logger:
--   - the operator's `logger` table (info/warn/error, each (message, fields);
--     rich-mode.md 3) when given, which gets every line;
--   - otherwise stderr, one JSON object per line {"time","level","msg",...}
--     (rich-mode.md 3's default), or the format `logFormat` names ("text" |
--     "json"; an explicit one is also the core's own lines' format, as for
--     sandbox{}); `logLevel` filters (default info).
-- A logger that raises loses that line only; it never breaks a turn or a
-- call. No payload or credential is ever a field: callers pass names,
-- statuses, counts and text that went through redact + scrubDiagnostic.
--
--   local L = log.new(logger, {logFormat=, logLevel=, audit=})
--   L.info(msg, fields), L.warn(...), L.error(...)
--   L.logger     the sandbox.log logger;  L.recorder  the call records' recorder,
--                whose reader writes the audit lines (audit = false: none)
--   log.upstream_failure(L, fields, ...tokens)   11.6 "sandbox upstream call failed"
local core = require "sandbox.core"
local lines = require "sandbox.ops.lines"
local logmod = require "sandbox.log"
local record = require "sandbox.ops.record"
local text = require "sandbox.rich._text"

local M = {}

M.UPSTREAM_FAILED = "sandbox upstream call failed"
M.BODY_CHARS = 2000
M.DEFAULT_FORMAT = "json"

function M.new(logger, o)
  o = o or {}
  local lg
  if logger ~= nil or o.logFormat ~= nil then
    lg = logmod.new { logger = logger, format = o.logFormat, level = o.logLevel }
  else
    -- the page's default, JSON lines on stderr, without changing the
    -- format of the core's own lines for the rest of the process
    lg = logmod.new { format = M.DEFAULT_FORMAT, level = o.logLevel, write = core.log_write }
  end
  local L = { logger = lg, recorder = record.recorder() }
  L.recorder:subscribe(lines.reader(lg, { audit = o.audit }))
  for _, level in ipairs { "info", "warn", "error" } do
    L[level] = function(msg, fields) lg:log(level, msg, fields) end
  end
  return L
end

-- 11.6: fields = {channel, upstream, latencyMs, status?, body?, error?, and
-- (providers.md 4) the provider's error type, request_id, fix and tries};
-- body and error lose every form of every token, then scrubDiagnostic(2000).
function M.upstream_failure(L, f, ...)
  local out = { channel = f.channel, turn = f.turn, upstream = f.upstream, latencyMs = f.latencyMs, status = f.status,
    type = f.type, request_id = f.request_id, fix = f.fix, tries = f.tries }
  if f.body ~= nil then out.body = text.scrub(text.redact(f.body, ...), M.BODY_CHARS) end
  if f.error ~= nil then out.error = text.scrub(text.redact(text.error_text(f.error), ...), M.BODY_CHARS) end
  L.warn(M.UPSTREAM_FAILED, out)
end

return M
