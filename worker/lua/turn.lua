-- turn.lua: reads and validates the turn object of spec/worker.md 2.1.
-- Any deviation is the internal error `invalid turn`.
local sbxw = require "sbxw"
local codec = require "codec"

local M = {}

M.MAX_BYTES = 262144

local is_object, is_array = codec.is_object, codec.is_array

-- ^[a-z][a-z0-9_]{0,47}$: host tool, MCP server and MCP tool names.
function M.valid_name(s)
  return type(s) == "string" and #s <= 48 and s:match("^[a-z][a-z0-9_]*$") ~= nil
end

-- ^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$
local function valid_zone_name(s)
  if type(s) ~= "string" or s == "" then return false end
  for part in (s .. "/"):gmatch("(.-)/") do
    if not part:match("^[A-Za-z0-9_+%-]+$") then return false end
  end
  return true
end

local function tool_spec(t)
  if not (is_object(t) and M.valid_name(t.name) and type(t.description) == "string"
          and is_object(t.parameters)) then
    return nil
  end
  return { name = t.name, description = t.description, parameters = t.parameters }
end

-- An array of tool specs with distinct names, as a plain list, or nil.
local function tool_list(list)
  if not is_array(list) then return nil end
  local out, seen = {}, {}
  for i = 1, #list do
    local spec = tool_spec(list[i])
    if not spec or seen[spec.name] then return nil end
    seen[spec.name] = true
    out[i] = spec
  end
  return out
end

local function parse(bytes, now)
  if type(bytes) ~= "string" or #bytes > M.MAX_BYTES then return nil end
  local t = codec.decode(bytes)
  if not is_object(t) then return nil end
  local speaker = t.speaker
  if type(t.text) ~= "string" or not is_object(speaker) or type(speaker.id) ~= "string"
     or type(speaker.name) ~= "string" or type(t.model) ~= "string"
     or type(t.prompt) ~= "string" or not valid_zone_name(t.timeZone) then
    return nil
  end
  if t.reset ~= nil and type(t.reset) ~= "boolean" then return nil end
  local tools = tool_list(t.tools)
  if not tools or not is_array(t.mcp) then return nil end
  local mcp = {}
  for i = 1, #t.mcp do
    local item = t.mcp[i]
    if not is_object(item) or not M.valid_name(item.server) then return nil end
    local list = tool_list(item.tools)
    if not list then return nil end
    mcp[i] = { server = item.server, tools = list }
  end
  local time_text = sbxw.local_time(t.timeZone, now)
  if type(time_text) ~= "string" then return nil end
  return {
    text = t.text,
    speaker = { id = speaker.id, name = speaker.name },
    model = t.model,
    prompt = t.prompt,
    time_zone = t.timeZone,
    time_text = time_text,
    reset = t.reset == true,
    tools = tools,
    mcp = mcp,
  }
end

-- parse(bytes, now) -> turn record, or nil, "invalid turn". `now` is the
-- clock's epoch seconds; the zone is checked by formatting that instant.
function M.parse(bytes, now)
  local turn = parse(bytes, now)
  if not turn then return nil, "invalid turn" end
  return turn
end

return M
