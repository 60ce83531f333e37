-- json.lua: the Lua face of the core's strict JSON (spec/broker.md section 8).
-- Decoded objects and arrays keep their kind (empty {} and [] stay apart),
-- objects keep member order, and JSON null is json.null, never nil.
local core = require "sandbox.core"

local M = {
  null = core.json_null,
  decode = core.json_decode,
  encode = core.json_encode,
  utf8_valid = core.utf8_valid,
}

local object_mt, array_mt, order = core.json_object_mt, core.json_array_mt, core.json_order

-- A new object whose members are encoded in the order of `names`.
-- values[name] may be nil (the member is then left out).
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

local function is_sequence(t)
  local n = #t
  if n == 0 then return false end
  local count = 0
  for _ in pairs(t) do count = count + 1 end
  return count == n
end

-- The JSON kind of a decoded value or of a plain Lua table as the encoder
-- would see it: "object", "array", "string", "number", "boolean", "null",
-- or nil for anything JSON cannot hold.
function M.kind(v)
  local t = type(v)
  if t == "table" then
    local mt = getmetatable(v)
    if mt == object_mt then return "object" end
    if mt == array_mt then return "array" end
    if mt ~= nil then return nil end
    return is_sequence(v) and "array" or "object"
  elseif t == "string" or t == "number" or t == "boolean" then
    return t
  elseif v == M.null then
    return "null"
  end
  return nil
end

function M.is_object(v) return M.kind(v) == "object" end
function M.is_array(v) return M.kind(v) == "array" end

-- Member names of an object in received order (decoded objects), else sorted.
function M.keys(obj)
  local list = order[obj]
  local out, seen = {}, {}
  if list then
    for _, k in ipairs(list) do
      if obj[k] ~= nil and not seen[k] then out[#out + 1] = k; seen[k] = true end
    end
  end
  local rest = {}
  for k in pairs(obj) do
    if type(k) == "string" and not seen[k] then rest[#rest + 1] = k end
  end
  table.sort(rest)
  for _, k in ipairs(rest) do out[#out + 1] = k end
  return out
end

-- Number of members of an object or elements of an array.
function M.count(v)
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  return n
end

return M
