-- rich/_text.lua: text, JSON and diagnostics for rich mode (spec/rich-mode.md
-- 19): characters are code points, errorText renders an error and its cause
-- chain, scrub is the C scrubDiagnostic, and redact replaces every form of a
-- credential the reflection filter knows (11.5) before a diagnostic is cut.
--
--   text.chars(s)            -> code points, or nil (not a string / invalid UTF-8)
--   text.within(s, lo, hi)   -> s is a valid string of lo..hi code points
--   text.error_text(err)     -> "<name>: <message> (cause: ...)" (64 levels)
--   text.scrub(s, max)       -> scrubDiagnostic (core/scrub.c)
--   text.forms(token)        -> the six forms of 11.5, longest first
--   text.redact(s, token...) -> s with every form of every token as [redacted]
--   text.js_string(v)        -> v as JavaScript's String(v) writes it (for the
--                               API-shaped refusal messages of 11.1)
local core = require "sandbox.core"
local json = require "sandbox.json"

local M = {}

M.MASK = "[redacted]"
M.MAX_CAUSES = 64

function M.chars(s)
  if type(s) ~= "string" then return nil end
  return utf8.len(s)
end

function M.within(s, lo, hi)
  local n = M.chars(s)
  return n ~= nil and n >= lo and n <= hi
end

-- errorText (19): a string as it is; a table {name?, message, cause?} as
-- "<name>: <message>" and " (cause: ...)" down the chain; anything else
-- through tostring.
function M.error_text(err)
  local out, depth = {}, 0
  while true do
    depth = depth + 1
    local piece
    if type(err) == "string" then
      piece = err
    elseif type(err) == "table" and err.message ~= nil then
      piece = tostring(err.name or "Error") .. ": " .. tostring(err.message)
    else
      piece = tostring(err)
    end
    out[#out + 1] = piece
    if type(err) ~= "table" or err.cause == nil or depth >= M.MAX_CAUSES then break end
    err = err.cause
  end
  local s = out[#out]
  for i = #out - 1, 1, -1 do s = out[i] .. " (cause: " .. s .. ")" end
  return s
end

M.scrub = core.scrub_diagnostic

local function uri_component(s)
  return (s:gsub("[^%w%-_.!~*'()]", function(c) return string.format("%%%02X", c:byte()) end))
end

function M.forms(token)
  local hex = core.hex(token)
  local list = { token, uri_component(token), core.base64(token), core.base64url(token), hex, hex:upper() }
  table.sort(list, function(a, b) return #a > #b end)
  return list
end

local function plain_replace(s, needle, with)
  if needle == "" then return s end
  local out, pos = {}, 1
  while true do
    local a, b = s:find(needle, pos, true)
    if not a then break end
    out[#out + 1] = s:sub(pos, a - 1)
    out[#out + 1] = with
    pos = b + 1
  end
  out[#out + 1] = s:sub(pos)
  return table.concat(out)
end

function M.redact(s, ...)
  for i = 1, select("#", ...) do
    local token = select(i, ...)
    if type(token) == "string" and token ~= "" then
      for _, f in ipairs(M.forms(token)) do s = plain_replace(s, f, M.MASK) end
    end
  end
  return s
end

local function number_string(v)
  if math.type(v) == "integer" then return string.format("%d", v) end
  if v ~= v then return "NaN" end
  if v == math.huge then return "Infinity" end
  if v == -math.huge then return "-Infinity" end
  if v == math.floor(v) and math.abs(v) < 1e21 then return string.format("%.0f", v) end
  for p = 15, 17 do
    local s = string.format("%." .. p .. "g", v)
    if tonumber(s) == v then return s end
  end
  return tostring(v)
end

function M.js_string(v, depth)
  depth = depth or 0
  local t = type(v)
  if v == nil then return "undefined" end
  if v == json.null then return "null" end
  if t == "string" then return v end
  if t == "number" then return number_string(v) end
  if t == "boolean" then return tostring(v) end
  if json.kind(v) == "array" and depth < 8 then
    local parts = {}
    for i = 1, #v do
      local x = v[i]
      parts[i] = (x == nil or x == json.null) and "" or M.js_string(x, depth + 1)
    end
    return table.concat(parts, ",")
  end
  return "[object Object]"
end

return M
