-- broker/_schema.lua: the schema locality walk of spec/broker.md section 9.4.
-- Tool parameter schemas travel to the provider in every /model request; a
-- remote reference in one would make the provider fetch a URL of the guest's
-- choosing, so only local references ("#...") are allowed, everywhere a
-- schema can sit. Works on decoded JSON and on plain Lua config tables alike.
-- Depth: the top-level parameters object is level 1; deeper than 64 fails,
-- which also stops cycles in Lua tables.
local json = require "sandbox.json"

local M = {}

M.MAX_DEPTH = 64

local REFS = { ["$ref"] = true, ["$dynamicRef"] = true, ["$recursiveRef"] = true,
               ["$schema"] = true, ["$id"] = true }
local MAPS = { properties = true, patternProperties = true, ["$defs"] = true,
               definitions = true, dependentSchemas = true }
local ONE_OR_MANY = { items = true, contains = true, additionalProperties = true,
                      unevaluatedProperties = true, unevaluatedItems = true,
                      propertyNames = true, ["not"] = true, ["if"] = true,
                      ["then"] = true, ["else"] = true, contentSchema = true,
                      additionalItems = true }
local ARRAYS = { allOf = true, anyOf = true, oneOf = true, prefixItems = true }

local function is_local_ref(v)
  return type(v) == "string" and v:sub(1, 1) == "#"
end

local acceptable

local function each_element(arr, depth)
  for _, v in ipairs(arr) do
    if not acceptable(v, depth) then return false end
  end
  return true
end

local function each_value(obj, depth)
  for _, v in pairs(obj) do
    if not acceptable(v, depth) then return false end
  end
  return true
end

-- Is v an acceptable schema at `depth`?
function acceptable(v, depth)
  if depth > M.MAX_DEPTH then return false end
  if type(v) == "boolean" then return true end
  if json.kind(v) ~= "object" then return false end
  for key, val in pairs(v) do
    if type(key) ~= "string" then return false end
    if REFS[key] then
      if not is_local_ref(val) then return false end
    elseif key == "$vocabulary" then
      if json.kind(val) ~= "object" then return false end
      for k in pairs(val) do
        if not is_local_ref(k) then return false end
      end
    elseif MAPS[key] then
      if json.kind(val) ~= "object" or not each_value(val, depth + 1) then return false end
    elseif ONE_OR_MANY[key] then
      if json.kind(val) == "array" then
        if not each_element(val, depth + 1) then return false end
      elseif not acceptable(val, depth + 1) then
        return false
      end
    elseif ARRAYS[key] then
      if json.kind(val) ~= "array" or not each_element(val, depth + 1) then return false end
    elseif key == "dependencies" then
      if json.kind(val) == "object" then
        for _, dep in pairs(val) do
          if json.kind(dep) ~= "array" and not acceptable(dep, depth + 1) then return false end
        end
      end
    end
    -- everything else is data (enum, const, default, required, ...): not walked
  end
  return true
end

-- Top-level tool parameters: a JSON object (true is refused here) whose
-- schema tree passes the walk.
function M.parameters_ok(params)
  return json.kind(params) == "object" and acceptable(params, 1)
end

return M
