-- codec.lua: the worker's JSON face (spec/worker.md section 3) over the
-- primitive module. Decoding is strict (sbxw.json_decode); decoded objects
-- and arrays carry sbxw's metatables, so `{}` and `[]` stay apart and member
-- order survives. Objects the worker builds get an explicit member order.
-- One encoder does every encoding, so what is measured is what is sent.
local sbxw = require "sbxw"

local M = {}

local object_mt, array_mt, order = sbxw.json_object_mt, sbxw.json_array_mt, sbxw.json_order

M.null = sbxw.json_null

-- bytes -> value, or nil, message (JSON null decodes to M.null, never nil).
function M.decode(bytes)
  if type(bytes) ~= "string" then return nil, "not a string" end
  local value, err = sbxw.json_decode(bytes)
  if value == nil then return nil, err or "invalid JSON" end
  return value
end

-- value -> compact bytes; raises on a value JSON cannot hold.
function M.encode(value)
  local bytes, err = sbxw.json_encode(value)
  if not bytes then error("json encode failed: " .. tostring(err), 0) end
  return bytes
end

-- A new object whose members encode in the order of `names`; a nil value
-- leaves its member out.
function M.object(names, values)
  local obj = setmetatable({}, object_mt)
  local kept = {}
  for _, name in ipairs(names) do
    local v = values[name]
    if v ~= nil then
      obj[name] = v
      kept[#kept + 1] = name
    end
  end
  order[obj] = kept
  return obj
end

function M.array(list)
  return setmetatable(list or {}, array_mt)
end

function M.is_object(v)
  return type(v) == "table" and getmetatable(v) == object_mt
end

function M.is_array(v)
  return type(v) == "table" and getmetatable(v) == array_mt
end

return M
