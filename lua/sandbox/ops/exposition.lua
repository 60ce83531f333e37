-- ops/exposition.lua: a small metrics registry and its Prometheus text
-- exposition, format version 0.0.4 (the format Prometheus's text parser
-- and `promtool check metrics` read). Pure: no I/O; the engine's own
-- metrics are declared in ops/metrics.lua, served by ops/metrics_listen.lua.
--
--   local ex = require "sandbox.ops.exposition"
--   local reg = ex.registry()
--   local c = reg:counter("sbx_turns_total", "Turns by reason.", { reason = REASONS })
--   c:inc { reason = "ok" }
--   local h = reg:histogram("sbx_turn_duration_seconds", "Turn time.", nil, { 0.5, 1, 5 })
--   h:observe(nil, 0.42)
--   reg:gauge("sbx_channel_queue_depth", "Waiting turns.", nil, function(emit) emit(nil, 3) end)
--   reg:render() -> the exposition text (ex.CONTENT_TYPE)
--
-- Bounded by construction: every label of a family names its closed set of
-- values when the family is declared (a set {value = true}, or a function
-- mapping an observed value to one of a bounded set or nil); an observation
-- whose label value is outside the set is dropped, never exposed, so no
-- guest-controlled text, credential or payload can become a label or a new
-- series. MAX_SERIES per family is a second bound. A label's function may
-- map a value to false: that series carries no such label (the sealed
-- mode's turn series have no `mode`, so their names stay as they were).
--
-- Text format (https://prometheus.io/docs/instrumenting/exposition_formats/):
-- per family `# HELP name text` (backslash and newline escaped) and
-- `# TYPE name counter|gauge|histogram`, then one line per sample
-- `name{label="value",...} number`; label values escape backslash, double
-- quote and newline; histograms expose cumulative `name_bucket{le="..."}`
-- lines ending with le="+Inf", then `name_sum` and `name_count`. Series
-- come in a stable order (their label values, sorted).
local M = {}

M.CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
M.MAX_SERIES = 2000

local NAME = "^[a-zA-Z_:][a-zA-Z0-9_:]*$"
local LABEL = "^[a-zA-Z_][a-zA-Z0-9_]*$"

-- A sample value: integers as integers, floats in the shortest form that
-- reads back equal, and the special values as the format spells them.
function M.number(v)
  if v ~= v then return "NaN" end
  if v == math.huge then return "+Inf" end
  if v == -math.huge then return "-Inf" end
  if math.type(v) == "integer" then return tostring(v) end
  if v == math.floor(v) and v > -2 ^ 53 and v < 2 ^ 53 then return string.format("%d", v) end
  for p = 15, 17 do
    local s = string.format("%." .. p .. "g", v)
    if tonumber(s) == v then return s end
  end
  return string.format("%.17g", v)
end

function M.escape_label(s)
  return (s:gsub('[\\"\n]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

function M.escape_help(s)
  return (s:gsub("[\\\n]", { ["\\"] = "\\\\", ["\n"] = "\\n" }))
end

local Family = {}
Family.__index = Family

-- The label names of a declaration, sorted, each checked.
local function label_names(labels)
  local names = {}
  for k, set in pairs(labels or {}) do
    assert(type(k) == "string" and k:find(LABEL) and k:sub(1, 2) ~= "__" and k ~= "le",
      "invalid label name " .. tostring(k))
    assert(type(set) == "table" or type(set) == "function", "label " .. k .. " needs its closed set")
    names[#names + 1] = k
  end
  table.sort(names)
  return names
end

-- The bounded label values of one observation, as a series key and the
-- values in label order; nil when a value is outside its set.
function Family:_key(lv)
  local names = self.label_names
  if #names == 0 then return "", {} end
  if type(lv) ~= "table" then return nil end
  local values = {}
  for i, k in ipairs(names) do
    local set, v = self.labels[k], lv[k]
    if type(set) == "function" then v = set(v)
    elseif not (type(v) == "string" and set[v]) then v = nil end
    if v ~= false and type(v) ~= "string" then return nil end
    values[i] = v
  end
  local parts = {}
  for i, v in ipairs(values) do parts[i] = v == false and "\1" or v end
  return table.concat(parts, "\0"), values
end

-- The series of one observation (created on first use), or nil.
function Family:_series(lv)
  local key, values = self:_key(lv)
  if key == nil then return nil end
  local s = self.series[key]
  if s == nil then
    if self.count >= M.MAX_SERIES then return nil end
    s = { values = values, value = 0 }
    if self.kind == "histogram" then
      s.buckets, s.sum = {}, 0
      for i = 1, #self.bounds do s.buckets[i] = 0 end
    end
    self.series[key] = s
    self.count = self.count + 1
  end
  return s
end

-- Counters: inc(lv [, n]) with n >= 0 (default 1).
function Family:inc(lv, n)
  n = n or 1
  if type(n) ~= "number" or n < 0 or n ~= n then return end
  local s = self:_series(lv)
  if s then s.value = s.value + n end
end

-- Gauges: set(lv, v), add(lv, delta).
function Family:set(lv, v)
  if type(v) ~= "number" then return end
  local s = self:_series(lv)
  if s then s.value = v end
end

function Family:add(lv, d)
  if type(d) ~= "number" then return end
  local s = self:_series(lv)
  if s then s.value = s.value + d end
end

-- Histograms: observe(lv, v) (NaN dropped).
function Family:observe(lv, v)
  if type(v) ~= "number" or v ~= v then return end
  local s = self:_series(lv)
  if not s then return end
  for i, b in ipairs(self.bounds) do
    if v <= b then s.buckets[i] = s.buckets[i] + 1 end
  end
  s.value = s.value + 1
  s.sum = s.sum + v
end

-- Makes every series of the given label values exist at 0 (so rate() and
-- absent-vs-zero read right from the first scrape).
function Family:init(lv)
  self:_series(lv)
end

local function label_text(names, values, extra)
  local parts = {}
  for i, k in ipairs(names) do
    if values[i] ~= false then parts[#parts + 1] = k .. '="' .. M.escape_label(values[i]) .. '"' end
  end
  if extra then parts[#parts + 1] = extra end
  if #parts == 0 then return "" end
  return "{" .. table.concat(parts, ",") .. "}"
end

local function sorted_series(series)
  local keys = {}
  for k in pairs(series) do keys[#keys + 1] = k end
  table.sort(keys)
  local out = {}
  for i, k in ipairs(keys) do out[i] = series[k] end
  return out
end

-- A collected gauge: its collect(emit) callback sets the values at render
-- time (emit(lv, value), summed when the same series is emitted twice).
function Family:_collect()
  local series, count = {}, 0
  local function emit(lv, v)
    if type(v) ~= "number" or v ~= v then return end
    local key, values = self:_key(lv)
    if key == nil then return end
    local s = series[key]
    if s == nil then
      if count >= M.MAX_SERIES then return end
      s = { values = values, value = 0 }
      series[key] = s
      count = count + 1
    end
    s.value = s.value + v
  end
  for _, lv in ipairs(self.always or {}) do emit(lv, 0) end
  pcall(self.collect, emit)
  return series
end

function Family:render(out)
  out[#out + 1] = "# HELP " .. self.name .. " " .. M.escape_help(self.help)
  out[#out + 1] = "# TYPE " .. self.name .. " " .. self.kind
  local names = self.label_names
  local series = self.collect and self:_collect() or self.series
  for _, s in ipairs(sorted_series(series)) do
    if self.kind == "histogram" then
      for i, b in ipairs(self.bounds) do
        out[#out + 1] = self.name .. "_bucket" .. label_text(names, s.values, 'le="' .. M.number(b) .. '"')
          .. " " .. M.number(s.buckets[i])
      end
      out[#out + 1] = self.name .. "_bucket" .. label_text(names, s.values, 'le="+Inf"') .. " " .. M.number(s.value)
      out[#out + 1] = self.name .. "_sum" .. label_text(names, s.values) .. " " .. M.number(s.sum)
      out[#out + 1] = self.name .. "_count" .. label_text(names, s.values) .. " " .. M.number(s.value)
    else
      out[#out + 1] = self.name .. label_text(names, s.values) .. " " .. M.number(s.value)
    end
  end
end

local Registry = {}
Registry.__index = Registry

function M.registry()
  return setmetatable({ families = {}, by_name = {} }, Registry)
end

function Registry:_family(kind, name, help, labels)
  assert(type(name) == "string" and name:find(NAME), "invalid metric name " .. tostring(name))
  assert(self.by_name[name] == nil, "metric registered twice: " .. name)
  assert(type(help) == "string" and help ~= "", "metric " .. name .. " needs its help text")
  local f = setmetatable({ kind = kind, name = name, help = help, labels = labels or {},
    label_names = label_names(labels), series = {}, count = 0 }, Family)
  self.families[#self.families + 1] = f
  self.by_name[name] = f
  if #f.label_names == 0 and kind ~= "histogram" then f:_series({}) end   -- 0 from the start
  return f
end

-- A counter family. labels: {name = closed set} or nil.
function Registry:counter(name, help, labels)
  return self:_family("counter", name, help, labels)
end

-- A gauge family; with collect, its values are collect(emit)'s at render
-- time, and `always` lists label values emitted at 0 first (a closed set
-- exposed whole: a state with nothing in it reads 0, not absent).
function Registry:gauge(name, help, labels, collect, always)
  local f = self:_family("gauge", name, help, labels)
  if collect then
    assert(type(collect) == "function", "gauge " .. name .. ": collect must be a function")
    f.collect, f.always, f.series = collect, always, {}
  end
  return f
end

-- A histogram family with the given upper bounds (ascending, finite).
function Registry:histogram(name, help, labels, bounds)
  assert(type(bounds) == "table" and #bounds > 0, "histogram " .. name .. " needs its buckets")
  for i, b in ipairs(bounds) do
    assert(type(b) == "number" and b < math.huge and (i == 1 or b > bounds[i - 1]),
      "histogram " .. name .. ": buckets must be finite and ascending")
  end
  local f = self:_family("histogram", name, help, labels)
  f.bounds = bounds
  if #f.label_names == 0 then f:_series({}) end
  return f
end

function Registry:get(name)
  return self.by_name[name]
end

-- The whole exposition, ending with a newline.
function Registry:render()
  local out = {}
  for _, f in ipairs(self.families) do f:render(out) end
  out[#out + 1] = ""
  return table.concat(out, "\n")
end

return M
