-- precheck/_grant.lua: what a precheck script may reach (shared/spec/
-- precheck.md 2.2 and 4 step 3). `grant(scope)` is the operator's function;
-- it runs on every describe and every run (it may yield: it runs in the
-- caller's task) and its result is checked each time, in the table's order.
-- The approved calls of a run then narrow the grant to what the script was
-- saved with.
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local names = require "sandbox.broker._names"

local M = {}

M.E_GRANT = errors.PRECHECK_GRANT
M.E_NAME = errors.PRECHECK_SERVER_NAME
M.E_ENDPOINT = errors.PRECHECK_ENDPOINT
M.E_HTTPS = errors.PRECHECK_HTTPS
M.E_TOOLS = errors.PRECHECK_TOOLS
M.E_TOKEN = errors.PRECHECK_TOKEN

local function fail(msg) error(msg, 0) end

-- A list: a table whose keys are exactly 1..#t (a decoded JSON array too).
local function is_list(t)
  if type(t) ~= "table" then return false end
  local mt = getmetatable(t)
  if mt ~= nil and mt ~= core.json_array_mt then return false end
  return json.count(t) == #t
end

local function server_name_ok(s)
  return type(s) == "string" and #s >= 1 and #s <= 100 and s:find("^[A-Za-z0-9_%-]+$") ~= nil
end

local function tool_name_ok(s)
  return type(s) == "string" and #s >= 1 and #s <= 128 and s:find("^[A-Za-z0-9_.%-]+$") ~= nil
end

-- The scope a grant sees: a fresh table each call.
function M.scope(channel, target, tier)
  return { channel = channel, target = target, tier = tier }
end

-- Checks one grant result; returns a list of servers
-- {name, url, tools = {name...}, token = function|nil} (copies), in order.
function M.check(result, allow_http)
  if not is_list(result) then fail(M.E_GRANT) end
  local out, seen = {}, {}
  for i = 1, #result do
    local s = result[i]
    if type(s) ~= "table" then fail(M.E_GRANT) end
    if not server_name_ok(s.name) or seen[s.name] then fail(M.E_NAME) end
    seen[s.name] = true
    local ok, err = names.check_endpoint(s.url, allow_http)
    if not ok then fail(err == names.URL_UNSAFE and M.E_HTTPS or M.E_ENDPOINT) end
    if not is_list(s.tools) then fail(M.E_TOOLS) end
    local tools, tseen = {}, {}
    for j = 1, #s.tools do
      local t = s.tools[j]
      if not tool_name_ok(t) or tseen[t] then fail(M.E_TOOLS) end
      tseen[t] = true
      tools[j] = t
    end
    if s.token ~= nil and type(s.token) ~= "function" then fail(M.E_TOKEN) end
    out[i] = { name = s.name, url = s.url, tools = tools, token = s.token }
  end
  return out
end

-- grant(scope) checked: the servers of M.check.
function M.call(grant, scope, allow_http)
  return M.check(grant(scope), allow_http)
end

-- Step 3 of a run: from each server only the tools whose (server, tool) pair
-- is among `approved` (a list of {server=, tool=}), in grant order; servers
-- left with none are dropped. Entries that are not such pairs approve
-- nothing.
function M.filter(servers, approved)
  local ok = {}
  if type(approved) == "table" then
    for _, a in ipairs(approved) do
      if type(a) == "table" and type(a.server) == "string" and type(a.tool) == "string" then
        ok[a.server .. "\0" .. a.tool] = true
      end
    end
  end
  local out = {}
  for _, s in ipairs(servers) do
    local tools = {}
    for _, t in ipairs(s.tools) do
      if ok[s.name .. "\0" .. t] then tools[#tools + 1] = t end
    end
    if #tools > 0 then
      out[#out + 1] = { name = s.name, url = s.url, tools = tools, token = s.token }
    end
  end
  return out
end

return M
