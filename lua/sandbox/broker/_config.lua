-- broker/_config.lua: the broker configuration checks of spec/broker.md
-- section 4 and the model route's options of spec/providers.md 1 (modelAuth,
-- maxOutputTokens 1-200,000, outputTokensField), run once per configuration: by sandbox{} and runtime
-- construction (3.1 step 14), or by broker.new for a broker made alone.
-- Returns a normalized, immutable-by-convention copy: tool and server tables
-- indexed by exact name in tables that hold only configured names. The
-- model apiKey is not part of it: broker.bind takes it with the turn.
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local names = require "sandbox.broker._names"
local schema = require "sandbox.broker._schema"
local retry = require "sandbox.broker._retry"
local upstream_error = require "sandbox.broker._upstream_error"

local M = {}

M.E_BUDGET = errors.BUDGET
M.E_TOOL = errors.TOOL
M.E_MCP = errors.MCP
M.E_MODEL = errors.MODEL
M.E_UNKNOWN = errors.UNKNOWN_OPTION

M.DEFAULT_MAX_CALLS = 48
M.DEFAULT_MAX_OUTPUT_TOKENS = 4096
M.MAX_OUTPUT_TOKENS = 200000
-- spec/providers.md 1: how the credential travels, and the member that
-- carries maxOutputTokens in the forced body.
M.MODEL_AUTH = { bearer = true, ["api-key"] = true, none = true }
M.DEFAULT_MODEL_AUTH = "bearer"
M.OUTPUT_FIELDS = { max_tokens = true, max_completion_tokens = true }
M.DEFAULT_OUTPUT_FIELD = "max_tokens"

local function fail(msg) error(msg, 0) end

local function whole_in(v, lo, hi)
  return math.type(v) == "integer" and v >= lo and v <= hi
    or (math.type(v) == "float" and v == math.floor(v) and v >= lo and v <= hi)
end

-- Raises "unknown sandbox option: <name>" (or `prefix` .. name) for the
-- first (sorted) key of opts that `allowed` (name -> true) lacks: sandbox{},
-- sandbox.runtime{} and the precheck runner each check their own option set
-- this way.
function M.check_option_names(opts, allowed, prefix)
  local unknown = {}
  for k in pairs(opts) do
    if not allowed[k] then unknown[#unknown + 1] = tostring(k) end
  end
  table.sort(unknown)
  if unknown[1] then fail((prefix or M.E_UNKNOWN) .. unknown[1]) end
end

-- Unicode White_Space code points.
local WHITE_SPACE = { [0x09] = true, [0x0A] = true, [0x0B] = true, [0x0C] = true, [0x0D] = true,
  [0x20] = true, [0x85] = true, [0xA0] = true, [0x1680] = true, [0x2028] = true, [0x2029] = true,
  [0x202F] = true, [0x205F] = true, [0x3000] = true }
for c = 0x2000, 0x200A do WHITE_SPACE[c] = true end

-- True when s is empty after trimming Unicode White_Space (invalid UTF-8 is
-- not blank: it holds something that is not white space).
function M.is_blank(s)
  local ok, blank = pcall(function()
    for _, c in utf8.codes(s) do
      if not WHITE_SPACE[c] then return false end
    end
    return true
  end)
  return ok and blank
end

-- A tool declaration (host tool or MCP tool) without its run function.
local function tool_shape_ok(t)
  if type(t) ~= "table" or not names.tool_name(t.name) then return false end
  if type(t.description) ~= "string" then return false end
  if type(t.parameters) ~= "table" then return false end
  local ok, encoded = pcall(json.encode, t.parameters)
  if not ok or type(encoded) ~= "string" or encoded:sub(1, 1) ~= "{" then return false end
  return schema.parameters_ok(t.parameters)
end

local function check_endpoint(url, allow_http)
  local ok, err = names.check_endpoint(url, allow_http)
  if not ok then fail(err) end
end

M.MAX_FALLBACKS = 4

-- modelFallbacks (issue 23 item 5): an ordered list of further endpoints of
-- the same wire format, tried when the first one's retries are exhausted.
-- Each must pass modelUrl's own checks; returns {{modelUrl, model,
-- modelHost}, ...} (empty when absent).
function M.check_fallbacks(list, allow_http)
  if list == nil then return {} end
  if type(list) ~= "table" or json.count(list) > M.MAX_FALLBACKS or json.count(list) ~= #list then
    fail(errors.MODEL_FALLBACKS)
  end
  local out = {}
  for i, f in ipairs(list) do
    if type(f) ~= "table" or type(f.model) ~= "string" or M.is_blank(f.model) or json.count(f) ~= 2 then
      fail(errors.MODEL_FALLBACKS)
    end
    check_endpoint(f.modelUrl, allow_http)
    out[i] = { modelUrl = f.modelUrl, model = f.model, modelHost = upstream_error.host(f.modelUrl) }
  end
  return out
end

-- Checks opts and returns the normalized configuration; raises the spec's
-- error string on the first failure.
function M.check(opts)
  if type(opts) ~= "table" then fail(errors.BROKER_OPTIONS) end
  local allow_http = opts.allowHttp == true
  if type(opts.model) ~= "string" or M.is_blank(opts.model) then fail(M.E_MODEL) end
  check_endpoint(opts.modelUrl, allow_http)
  local auth = opts.modelAuth == nil and M.DEFAULT_MODEL_AUTH or opts.modelAuth
  if not M.MODEL_AUTH[auth] then fail(errors.MODEL_AUTH) end
  local max_tokens = opts.maxOutputTokens == nil and M.DEFAULT_MAX_OUTPUT_TOKENS or opts.maxOutputTokens
  if not whole_in(max_tokens, 1, M.MAX_OUTPUT_TOKENS) then fail(errors.MAX_OUTPUT_TOKENS) end
  local field = opts.outputTokensField == nil and M.DEFAULT_OUTPUT_FIELD or opts.outputTokensField
  if not M.OUTPUT_FIELDS[field] then fail(errors.OUTPUT_FIELD) end
  local retries = retry.check(opts.upstreamRetries)
  local fallbacks = M.check_fallbacks(opts.modelFallbacks, allow_http)
  local max_calls = opts.maxCalls == nil and M.DEFAULT_MAX_CALLS or opts.maxCalls
  if not whole_in(max_calls, 1, 1000) then fail(M.E_BUDGET) end

  local tools, tool_list = {}, {}
  if opts.tools ~= nil then
    if type(opts.tools) ~= "table" then fail(M.E_TOOL) end
    for _, t in ipairs(opts.tools) do
      if not tool_shape_ok(t) or type(t.run) ~= "function" or tools[t.name] then fail(M.E_TOOL) end
      local entry = { name = t.name, description = t.description, parameters = t.parameters, run = t.run }
      tools[t.name] = entry
      tool_list[#tool_list + 1] = entry
    end
    if #tool_list ~= json.count(opts.tools) then fail(M.E_TOOL) end
  end

  local servers, server_list = {}, {}
  if opts.mcp ~= nil then
    if type(opts.mcp) ~= "table" then fail(M.E_MCP) end
    for _, s in ipairs(opts.mcp) do
      if type(s) ~= "table" or not names.tool_name(s.name) or servers[s.name] then fail(M.E_MCP) end
      check_endpoint(s.url, allow_http)
      if s.apiKey ~= nil and type(s.apiKey) ~= "function" then fail(M.E_MCP) end
      if type(s.tools) ~= "table" then fail(M.E_MCP) end
      local by_name, list = {}, {}
      for _, t in ipairs(s.tools) do
        if not tool_shape_ok(t) or by_name[t.name] then fail(M.E_MCP) end
        local entry = { name = t.name, description = t.description, parameters = t.parameters }
        by_name[t.name] = entry
        list[#list + 1] = entry
      end
      if #list ~= json.count(s.tools) then fail(M.E_MCP) end
      local server = { name = s.name, url = s.url, apiKey = s.apiKey, tools = by_name, tool_list = list }
      servers[s.name] = server
      server_list[#server_list + 1] = server
    end
    if #server_list ~= json.count(opts.mcp) then fail(M.E_MCP) end
  end

  return {
    model = opts.model,
    modelUrl = opts.modelUrl,
    allowHttp = allow_http,
    modelAuth = auth,
    modelHost = upstream_error.host(opts.modelUrl),
    outputTokensField = field,
    maxCalls = math.tointeger(max_calls),
    maxOutputTokens = math.tointeger(max_tokens),
    upstreamRetries = retries,
    fallbacks = fallbacks,
    tools = tools, tool_list = tool_list,
    servers = servers, server_list = server_list,
    transport = opts.transport,
    -- trusted test seam of broker.new only (sandbox{} refuses the name):
    -- {header_ms, request_ms, call_ms}, the listener's and the call's
    -- deadlines, only ever lowered
    listen = type(opts.listenTimeouts) == "table" and opts.listenTimeouts or nil,
  }
end

return M
