-- precheck/_message.lua: the upstream answer of one forwarded precheck call
-- (shared/spec/precheck.md 5.2 message extraction, 5.3 reflection rules).
--
--   extract(body, content_type) -> the JSON-RPC message (a decoded object)
--                                  or nil
--   reflects(filter, message)   -> true when the message carries a needle
--
-- An event-stream answer (content type containing text/event-stream, any
-- case) is read as SSE: lines end at LF or CRLF; a `data:` line contributes
-- its rest minus one leading space; a blank line, or the end of the body,
-- closes an event that has data lines (joined with LF); the last event whose
-- data decodes to a JSON object wins. Anything else must decode, whole, to a
-- JSON object. Decoding is the broker's strict JSON; a refusal is no message.
local json = require "sandbox.json"

local M = {}

local function object_of(text)
  local v = json.decode(text)
  if v ~= nil and json.kind(v) == "object" then return v end
  return nil
end

local function sse_last_object(body)
  local last, data = nil, {}
  local function close_event()
    if #data == 0 then return end
    local v = object_of(table.concat(data, "\n"))
    if v ~= nil then last = v end
    data = {}
  end
  local pos, len = 1, #body
  while pos <= len do
    local nl = body:find("\n", pos, true)
    local stop = nl and nl - 1 or len
    if stop >= pos and body:byte(stop) == 13 and nl then stop = stop - 1 end   -- CRLF
    if stop < pos then
      close_event()                                                          -- blank line
    elseif body:sub(pos, pos + 4) == "data:" then
      local rest = body:sub(pos + 5, stop)
      if rest:sub(1, 1) == " " then rest = rest:sub(2) end
      data[#data + 1] = rest
    end
    if not nl then break end
    pos = nl + 1
  end
  close_event()                                                              -- end of body
  return last
end

function M.is_event_stream(content_type)
  return type(content_type) == "string"
    and content_type:lower():find("text/event-stream", 1, true) ~= nil
end

function M.extract(body, content_type)
  if type(body) ~= "string" then return nil end
  if M.is_event_stream(content_type) then return sse_last_object(body) end
  return object_of(body)
end

-- Every string and member name is searched; a string that, trimmed, starts
-- with [, { or " is decoded and walked one level deeper; past 64 levels
-- counts as a hit (core/reflect.c, hit_value's json_strings mode).
function M.reflects(filter, message)
  return filter:hit_value(message, true)
end

return M
