-- log.lua: the engine's one operator logger (spec/operations.md 2). Every
-- line the host writes about turns, broker calls and the installation goes
-- through a logger made here, so one option set decides its format, level
-- and destination:
--
--   local log = require "sandbox.log"
--   local logger = log.new { format = "text", level = "info" }   -- stderr
--   logger:warn("turn finished", { channel = "discord:1", turn = "3f2a", reason = "deadline" })
--   logger:enabled("debug") -> boolean
--
-- Formats, one event per line:
--   text  2026-12-01T19:43:22.104Z warn turn finished channel=discord:1 turn=3f2a reason=deadline
--         a value that is empty or holds anything outside [A-Za-z0-9_.:/@%+,-] is
--         quoted, with \" \\ \n \r \t and \u00XX escapes (log.quote), so a
--         line splits back into the same fields;
--   json  {"time":"...","level":"warn","msg":"turn finished","channel":"discord:1",...}
-- When stderr is the journal (JOURNAL_STREAM names it), a line starts with
-- its syslog priority (<3> error, <4> warn, <6> info, <7> debug) and carries
-- no time of its own. Fields come in a fixed order: channel, turn, route,
-- status, reason first (every line about a turn carries channel and turn),
-- then the others sorted.
--
-- Destinations, the first that applies: opts.logger, a table {debug?, info,
-- warn, error} of functions(message, fields) (the `logger` option; the Bun
-- bridge's lines arrive this way), then opts.sink, a function(level, message,
-- fields) (an embedding host's log), then stderr. A destination that raises
-- loses that line only.
--
-- What callers pass is never a payload: no credential, header value, body,
-- guest text, tool argument or result, URL path or query, or an upstream's
-- error text (spec/operations.md 2 "Never"). The fields are the records'
-- own (sandbox/ops/record.lua).
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local M = {}

M.LEVELS = { debug = 10, info = 20, warn = 30, error = 40 }
M.PRIORITY = { error = 3, warn = 4, info = 6, debug = 7 }
M.FORMATS = { text = true, json = true }
M.DEFAULT_FORMAT = "text"
M.DEFAULT_LEVEL = "info"
M.FIRST = { "channel", "turn", "route", "status", "reason" }

local FIRST_RANK = {}
for i, k in ipairs(M.FIRST) do FIRST_RANK[k] = i end

local function fail(msg) error(msg, 0) end

-- The option checks (sandbox{} and sandbox.runtime{}): logFormat, logLevel,
-- audit and logger. Raises the catalogue's strings.
function M.check_options(opts)
  if opts.logFormat ~= nil and not M.FORMATS[opts.logFormat] then fail(errors.LOG_FORMAT) end
  if opts.logLevel ~= nil and not M.LEVELS[opts.logLevel] then fail(errors.LOG_LEVEL) end
  if opts.audit ~= nil and type(opts.audit) ~= "boolean" then fail(errors.AUDIT) end
  local lg = opts.logger
  if lg ~= nil then
    if type(lg) ~= "table" then fail(errors.LOGGER) end
    for k, v in pairs(lg) do
      if not M.LEVELS[k] or type(v) ~= "function" then fail(errors.LOGGER) end
    end
    for _, k in ipairs { "info", "warn", "error" } do
      if type(lg[k]) ~= "function" then fail(errors.LOGGER) end
    end
  end
end

-- The field names of a fields table in line order.
function M.order(fields)
  local keys = {}
  for k, v in pairs(fields or {}) do
    if type(k) == "string" and v ~= nil then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b)
    local ra, rb = FIRST_RANK[a], FIRST_RANK[b]
    if ra and rb then return ra < rb end
    if ra or rb then return ra ~= nil end
    return a < b
  end)
  return keys
end

local ESCAPES = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }

-- A text-format value: bare when it is a non-empty run of
-- [A-Za-z0-9_.:/@%+,-], else quoted with escapes.
function M.quote(v)
  local s = tostring(v)
  if s ~= "" and not s:find("[^%w_%.:/@%%%+,%-]") then return s end
  return '"' .. s:gsub('[%c"\\]', function(c)
    return ESCAPES[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

-- A message stays on its line: control characters become spaces.
local function one_line(msg)
  return (tostring(msg):gsub("%c", " "))
end

local function field_value(v)
  local t = type(v)
  if t == "number" or t == "boolean" then return v end
  return tostring(v)
end

-- One text line (without its newline). time is nil under the journal.
function M.format_text(time, level, msg, fields, priority)
  local out = {}
  if priority then out[1] = "<" .. priority .. ">" .. level
  else out[1] = time .. " " .. level end
  out[2] = one_line(msg)
  for _, k in ipairs(M.order(fields)) do
    out[#out + 1] = k .. "=" .. M.quote(field_value(fields[k]))
  end
  return table.concat(out, " ")
end

-- One JSON line: time (not under the journal), level, msg, then the fields.
function M.format_json(time, level, msg, fields, priority)
  local names, values = {}, {}
  if not priority then names[1], values.time = "time", time end
  names[#names + 1], values.level = "level", level
  names[#names + 1], values.msg = "msg", one_line(msg)
  for _, k in ipairs(M.order(fields)) do
    if values[k] == nil then
      names[#names + 1] = k
      values[k] = field_value(fields[k])
    end
  end
  local line = json.encode(json.object(names, values))
  if line == nil then
    -- a value that is not valid UTF-8 (never ours): the event, without fields
    line = json.encode(json.object({ "time", "level", "msg" },
      { time = not priority and time or nil, level = level, msg = "log line not encodable" }))
  end
  return (priority and ("<" .. priority .. ">") or "") .. line
end

local Logger = {}
Logger.__index = Logger

-- opts = {format, level, logger (table), sink (function), journal (boolean;
-- default: core.log_journal()), write (function(line); default
-- core.log_write), clock (function() -> time text)}.
function M.new(opts)
  opts = opts or {}
  M.check_options { logFormat = opts.format, logLevel = opts.level, logger = opts.logger }
  local self = setmetatable({
    format = opts.format or M.DEFAULT_FORMAT,
    level = opts.level or M.DEFAULT_LEVEL,
    logger = opts.logger,
    sink = opts.sink,
    journal = opts.journal,
    write = opts.write or core.log_write,
    clock = opts.clock or core.log_time,
  }, Logger)
  self.min = M.LEVELS[self.level]
  if self.journal == nil then self.journal = core.log_journal() end
  if self.logger == nil and self.sink == nil and opts.write == nil then
    -- the core's own lines (core.log) follow the same format
    core.log_set_format(self.format)
  end
  return self
end

-- A logger from the option names of sandbox{} / sandbox.runtime{}.
function M.from_options(o, sink)
  return M.new { format = o.logFormat, level = o.logLevel, logger = o.logger, sink = sink }
end

function Logger:enabled(level)
  local n = M.LEVELS[level]
  return n ~= nil and n >= self.min
end

function Logger:log(level, msg, fields)
  if not self:enabled(level) then return end
  fields = fields or {}
  if self.logger then
    local fn = self.logger[level]
    if type(fn) ~= "function" then return end
    local copy = {}
    for k, v in pairs(fields) do copy[k] = field_value(v) end
    pcall(fn, msg, copy)
    return
  end
  if self.sink then
    pcall(self.sink, level, msg, fields)
    return
  end
  local priority = self.journal and M.PRIORITY[level] or nil
  local time = not priority and self.clock() or nil
  local line
  if self.format == "json" then line = M.format_json(time, level, msg, fields, priority)
  else line = M.format_text(time, level, msg, fields, priority) end
  pcall(self.write, line)
end

function Logger:debug(msg, fields) self:log("debug", msg, fields) end
function Logger:info(msg, fields) self:log("info", msg, fields) end
function Logger:warn(msg, fields) self:log("warn", msg, fields) end
function Logger:error(msg, fields) self:log("error", msg, fields) end

-- The logger as the function(level, msg, fields) older call sites take.
function Logger:fn()
  return function(level, msg, fields) self:log(level, msg, fields) end
end

M.Logger = Logger

return M
