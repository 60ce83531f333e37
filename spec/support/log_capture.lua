-- log_capture.lua: a real operator logger (sandbox/log.lua) whose lines are
-- kept in a list instead of stderr, and the recorder a broker or a runtime
-- writes its records to, with the product's own line writer as reader.
--
--   local C = require "log_capture"
--   local cap = C.new { format = "text" }      -- or "json"
--   sandbox.broker { ..., recorder = cap.recorder }
--   cap.lines            -- every line written, in order
--   cap:find("broker refused")  -> the first line holding that text, or nil
--   C.parse_text(line)   -- {time, level, msg, fields = {k = v}, order = {k...}}
--
-- parse_text is the inverse of the text format's quoting (log.quote): the
-- specs check that every value round-trips.
local lines = require "sandbox.ops.lines"
local log = require "sandbox.log"
local record = require "sandbox.ops.record"

local C = {}

local Capture = {}
Capture.__index = Capture

function C.new(opts)
  opts = opts or {}
  local self = setmetatable({ lines = {} }, Capture)
  self.logger = log.new {
    format = opts.format or "text", level = opts.level or "debug", journal = opts.journal or false,
    write = function(line) self.lines[#self.lines + 1] = line end,
  }
  self.recorder = record.recorder()
  self.recorder:subscribe(lines.reader(self.logger, { audit = opts.audit }))
  return self
end

function Capture:find(text)
  for _, l in ipairs(self.lines) do
    if l:find(text, 1, true) then return l end
  end
  return nil
end

function Capture:all(text)
  local out = {}
  for _, l in ipairs(self.lines) do
    if l:find(text, 1, true) then out[#out + 1] = l end
  end
  return out
end

function Capture:clear() self.lines = {} end

local UNESCAPE = { ['"'] = '"', ["\\"] = "\\", n = "\n", r = "\r", t = "\t" }

-- Splits one text-format line back into its parts.
function C.parse_text(line)
  local prefix, rest = line:match("^<(%d)>(.*)$")
  local out = { fields = {}, order = {} }
  if prefix then
    out.priority = tonumber(prefix)
    out.level, rest = rest:match("^(%a+) (.*)$")
  else
    out.time, out.level, rest = line:match("^(%S+) (%a+) (.*)$")
  end
  assert(out.level, "not a log line: " .. line)
  -- the message runs up to the first " key=" (messages hold no '=')
  local msg_end = rest:find(" [%w_]+=") or (#rest + 1)
  out.msg = rest:sub(1, msg_end - 1)
  local pos = msg_end + 1
  while pos <= #rest do
    local key, eq = rest:match("^([%w_]+)=()", pos)
    assert(key, "bad field at " .. pos .. " in " .. line)
    local value
    if rest:sub(eq, eq) == '"' then
      local parts, i = {}, eq + 1
      while true do
        local c = rest:sub(i, i)
        assert(c ~= "", "unterminated quote in " .. line)
        if c == '"' then break end
        if c == "\\" then
          local e = rest:sub(i + 1, i + 1)
          if e == "u" then
            parts[#parts + 1] = string.char(tonumber(rest:sub(i + 2, i + 5), 16))
            i = i + 6
          else
            parts[#parts + 1] = assert(UNESCAPE[e], "bad escape in " .. line)
            i = i + 2
          end
        else
          parts[#parts + 1] = c
          i = i + 1
        end
      end
      value = table.concat(parts)
      pos = i + 2
    else
      local stop = rest:find(" ", eq, true) or (#rest + 1)
      value = rest:sub(eq, stop - 1)
      pos = stop + 1
    end
    out.fields[key] = value
    out.order[#out.order + 1] = key
  end
  return out
end

return C
