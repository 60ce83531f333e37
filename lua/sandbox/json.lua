-- json.lua: the Lua face of the core's strict JSON (spec/broker.md section 8).
-- Decoded objects and arrays keep their kind (empty {} and [] stay apart),
-- objects keep member order, and JSON null is json.null, never nil.
--
--   json.decode(s) / json.encode(v[, max]) / json.utf8_valid(s)   the core's
--   json.decode_last(s)  the same, except a repeated member name's last value
--                        wins (rich mode's bodies, rich-mode.md 19)
--   json.decode_shape(s, shape[, max_values])   one flat object of known
--                     scalar members, refused before building anything else
--   json.decode_body(s[, shape])   an untrusted request body, shape first and
--                     bounded (core/json_shape.c): the text is scanned against
--                     the shape and the budget (json.body_budget(#s): at most
--                     3x the body, 32 MiB floor, of estimated Lua memory)
--                     before anything is built; a repeated member's last
--                     value wins. -> value | nil, why[, path]
--   json.cost(s[, shape])  the scan's estimate of what decoding s would take
--   json.object(names, values) / json.array(list)   values that encode in order
--   json.kind(v) / json.is_object(v) / json.is_array(v) / json.keys(o) / json.count(v)
--   json.plain(v)     decoded JSON -> plain Lua tables (null members left out)
--   json.jsonable(v)  any Lua value -> what json.encode accepts (or nil: leave out)
--   json.value(v)     json.jsonable(v), with a left-out value as json.null
-- The last three bound their recursion at MAX_DEPTH (the spec's 64 levels).
local core = require "sandbox.core"

local M = {
  null = core.json_null,
  decode = core.json_decode,
  decode_shape = core.json_decode_shape,
  encode = core.json_encode,
  utf8_valid = core.utf8_valid,
}

M.MAX_DEPTH = 64

local LAST_WINS = { duplicates = "last" }
function M.decode_last(s) return core.json_decode(s, nil, LAST_WINS) end

-- Request bodies: the estimated Lua memory a decode may take is at most
-- BODY_FACTOR times the body (so the host holds at most about 4x a body at
-- its limit: the bytes and their values), or BODY_FLOOR for small bodies.
M.BODY_FACTOR = 3
M.BODY_FLOOR = 32 * 1024 * 1024
function M.body_budget(n) return math.max(M.BODY_FLOOR, M.BODY_FACTOR * n) end

function M.decode_body(s, shape)
  return core.json_decode_bounded(s, { budget = M.body_budget(#s), duplicates = "last", shape = shape })
end
M.cost = core.json_cost

local object_mt, array_mt, order = core.json_object_mt, core.json_array_mt, core.json_order
local null = M.null

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

local function plain(v, depth)
  if v == null then return nil end
  if type(v) ~= "table" or depth > M.MAX_DEPTH then return v end
  local out = {}
  if getmetatable(v) == array_mt then
    for i = 1, #v do out[i] = plain(v[i], depth + 1) end
  else
    for k, x in pairs(v) do out[k] = plain(x, depth + 1) end
  end
  return out
end

-- Decoded JSON -> plain Lua tables, so `if x` reads a null member as absent.
function M.plain(v) return plain(v, 0) end

local jsonable

local function array_of(v, n, depth)
  local a = setmetatable({}, array_mt)
  for i = 1, n do
    local j = jsonable(v[i], depth + 1)
    if j == nil then j = null end
    a[i] = j
  end
  return a
end

function jsonable(v, depth)
  local t = type(v)
  if v == nil or v == null then return null end
  if t == "string" or t == "boolean" then return v end
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return null end
    return v
  end
  if t ~= "table" or depth > M.MAX_DEPTH then return nil end
  local mt = getmetatable(v)
  if mt == array_mt then return array_of(v, #v, depth) end
  local n, count = #v, 0
  for _ in pairs(v) do count = count + 1 end
  if n > 0 and count == n then return array_of(v, n, depth) end
  local o = setmetatable({}, object_mt)
  local names = {}
  for k, x in pairs(v) do
    if type(k) == "string" then
      local j = jsonable(x, depth + 1)
      if j ~= nil then o[k] = j names[#names + 1] = k end
    end
  end
  local kept = mt == object_mt and order[v] or nil
  if kept then
    local seen, ordered = {}, {}
    for _, k in ipairs(kept) do if o[k] ~= nil then ordered[#ordered + 1] = k seen[k] = true end end
    table.sort(names)
    for _, k in ipairs(names) do if not seen[k] then ordered[#ordered + 1] = k end end
    order[o] = ordered
  end
  return o
end

-- Any Lua value -> something json.encode accepts: functions, threads and
-- other userdata are left out (nil), nil becomes null, a non-finite number
-- null, a sequence an array; an ordered object keeps its member order.
function M.jsonable(v) return jsonable(v, 0) end

function M.value(v)
  local j = jsonable(v, 0)
  if j == nil then return null end
  return j
end

return M
