-- rich/_options.lua: the construction checks of spec/rich-mode.md section 3,
-- in the page's order, with its exact error strings (raised with no position
-- prefix). `M.resolve(opts, host)` returns the resolved options; its only
-- side effect is step 9 (partyDir created 0700). `host` is the identity the
-- checks judge ({uid, gid, linux}), the process's own unless a spec passes
-- another one (a spec cannot become root to see step 3 refuse it).
--
-- Steps:
--   1 partyDir absolute, not /          6 the compactor's timeout leaves half the turn
--   2 Linux, when no driver is given    7 endpoints, MCP names, host tool names,
--   3 uid and gid above 0                 maxCalls, maxOutputTokens, the compactor
--   4 containerPrefix                   8 timeZone
--   5 turnTimeoutMs, startTimeoutMs     9 partyDir private and host-owned (real path kept)
-- The required options the page names without a message of their own (image,
-- profiles, oauthToken, effort.judge, and the shape of memory, tools, mcp,
-- logger and driver) are checked between 8 and 9, so no side effect happens
-- for a refused configuration: "Invalid Pi sandbox option: <name>"; so are
-- the operator log's options sandbox{} takes too (logFormat, logLevel,
-- audit: spec/operations.md 2-3), with their own messages.
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local logmod = require "sandbox.log"
local retry = require "sandbox.broker._retry"
local runtime_options = require "sandbox.runtime._options"

local M = {}

-- The one declaration of the option names (rich/_option_table.lua: pure, so
-- the Bun bridge's generator reads it without the engine).
local option_table = require "sandbox.rich._option_table"
M.TABLE, M.NAMES, M.PLAIN = option_table.TABLE, option_table.NAMES, option_table.PLAIN

M.DEFAULTS = {
  upstream = "https://api.anthropic.com",
  timeZone = "UTC",
  containerPrefix = "roundtable-sandbox",
  labelChannel = "roundtable.sandbox.channel",
  labelProfile = "roundtable.sandbox.profile",
  startTimeoutMs = 90000,
  turnTimeoutMs = 600000,
  maxCalls = 128,
  maxOutputTokens = 128000,
  memoryVisibility = "private",
  compactionMaxRequestBytes = 32 * 1024 * 1024,
}
M.MIN_DEADLINE_MS, M.MAX_DEADLINE_MS = 1000, 600000
M.MAX_CALLS = 1000
M.MIN_OUTPUT, M.MAX_OUTPUT = 1025, 200000
M.MAX_COMPACTION_BYTES = 96 * 1024 * 1024

M.TOOL_NAME = "^[a-zA-Z0-9_-]+$"     -- 1-128
M.SERVER_NAME = "^[a-zA-Z0-9_-]+$"   -- 1-100
M.PROFILE_NAME = "^[a-zA-Z0-9_-]+$"  -- 1-100 (5.2)
M.ENGINE = "^[a-zA-Z0-9@/._-]+$"     -- 1-100

local function fail(msg) error(msg, 0) end
local function bad(name) fail(errors.RICH_OPTION .. name) end

local as_integer = container.as_integer

function M.name_ok(s, max)
  return type(s) == "string" and #s >= 1 and #s <= max and s:find("^[a-zA-Z0-9_-]+$") ~= nil
end
function M.tool_name_ok(s) return M.name_ok(s, 128) end
function M.server_name_ok(s) return M.name_ok(s, 100) end

local function deadline(v, default)
  if v == nil then return default end
  local ms = as_integer(v)
  if not ms or ms < M.MIN_DEADLINE_MS or ms > M.MAX_DEADLINE_MS then fail(errors.RICH_DEADLINE) end
  return ms
end

-- A trusted endpoint (step 7): https (or http when allowed), an authority
-- without userinfo, no query or fragment, printable ASCII only. Returns the
-- URL without a trailing "/" (11.3's target rule), or nil.
function M.endpoint(url, allow_http)
  if type(url) ~= "string" or #url == 0 or #url > 2048 or url:find("[^\33-\126]") then return nil end
  local scheme, rest = url:match("^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
  if not scheme then return nil end
  scheme = scheme:lower()
  if scheme ~= "https" and not (scheme == "http" and allow_http) then return nil end
  if rest:find("[?#@\\]") then return nil end
  local authority = rest:match("^([^/]*)")
  if authority == "" then return nil end
  local host, port = authority:match("^(%[[%x:.]+%]):?(%d*)$")
  if not host then host, port = authority:match("^([%w.%-_]+):?(%d*)$") end
  if not host or (port ~= "" and (#port > 5 or tonumber(port) > 65535 or tonumber(port) == 0)) then return nil end
  if authority:find(":$") then return nil end
  return (url:gsub("/+$", ""))
end

local function list_of_strings(v)
  if type(v) ~= "table" then return nil end
  local out = {}
  for k in pairs(v) do
    if math.type(k) ~= "integer" or k < 1 or k > #v then return nil end
  end
  for i = 1, #v do
    if type(v[i]) ~= "string" then return nil end
    out[i] = v[i]
  end
  return out
end

-- The compactor's shape (step 7): engine, compact, timeoutMs, maxRequestBytes.
local function compactor(c, turn_ms)
  if type(c) ~= "table" then fail(errors.RICH_COMPACTOR) end
  if type(c.engine) ~= "string" or #c.engine < 1 or #c.engine > 100 or not c.engine:find(M.ENGINE) then
    fail(errors.RICH_COMPACTOR)
  end
  if type(c.compact) ~= "function" then fail(errors.RICH_COMPACTOR) end
  local t = M.compactor_timeout(c, turn_ms)
  local tms = as_integer(t)
  if not tms or tms < M.MIN_DEADLINE_MS or tms > M.MAX_DEADLINE_MS then fail(errors.RICH_COMPACTOR) end
  local max = c.maxRequestBytes == nil and M.DEFAULTS.compactionMaxRequestBytes or as_integer(c.maxRequestBytes)
  if not max or max < 1 or max > M.MAX_COMPACTION_BYTES then fail(errors.RICH_COMPACTOR) end
  return { engine = c.engine, compact = c.compact, timeoutMs = tms, maxRequestBytes = max }
end

-- Step 6's default: max(1000, min(120000, floor(turnTimeoutMs / 3))).
function M.compactor_timeout(c, turn_ms)
  if c.timeoutMs ~= nil then return c.timeoutMs end
  return math.max(1000, math.min(120000, turn_ms // 3))
end

local function mcp_servers(mcp, allow_http)
  local servers, by_name = {}, {}
  if mcp == nil then return servers, by_name, nil end
  if type(mcp) ~= "table" then bad("mcp") end
  if mcp.token ~= nil and type(mcp.token) ~= "function" then bad("mcp.token") end
  local list = mcp.servers or {}
  if type(list) ~= "table" then bad("mcp.servers") end
  for i = 1, #list do
    local s = list[i]
    if type(s) ~= "table" then bad("mcp.servers") end
    local url = M.endpoint(s.url, allow_http)
    if not url then fail(errors.RICH_ENDPOINT) end
    servers[i] = { name = s.name, url = s.url, tools = s.tools }
  end
  for _, s in ipairs(servers) do
    if not M.server_name_ok(s.name) or by_name[s.name] then fail(errors.RICH_MCP_NAME) end
    by_name[s.name] = s
  end
  for _, s in ipairs(servers) do
    local tools = list_of_strings(s.tools or {})
    if not tools then bad("mcp.servers[].tools") end
    s.tools, s.tool_set = tools, {}
    for _, t in ipairs(tools) do
      if not M.tool_name_ok(t) then bad("mcp.servers[].tools") end
      s.tool_set[t] = true
    end
  end
  return servers, by_name, mcp.token
end

local function host_tools(tools)
  if tools == nil then return { names = {}, set = {}, call = nil } end
  if type(tools) ~= "table" then bad("tools") end
  local names = list_of_strings(tools.names or {})
  if not names then fail(errors.RICH_TOOL_NAME) end
  local set = {}
  for _, n in ipairs(names) do
    if not M.tool_name_ok(n) or set[n] then fail(errors.RICH_TOOL_NAME) end
    set[n] = true
  end
  if #names > 0 and type(tools.call) ~= "function" then bad("tools.call") end
  return { names = names, set = set, call = tools.call }
end

local function profiles(p)
  if type(p) ~= "table" or next(p) == nil then bad("profiles") end
  local out = {}
  for name, prof in pairs(p) do
    if not M.name_ok(name, 100) or type(prof) ~= "table" then bad("profiles") end
    if type(prof.model) ~= "string" or prof.model == "" or prof.model:find("[^\33-\126]") then
      bad("profiles." .. name .. ".model")
    end
    local mcp = list_of_strings(prof.mcp or {})
    if not mcp then bad("profiles." .. name .. ".mcp") end
    out[name] = { model = prof.model, mcp = mcp }
  end
  return out
end

local function logger(l)
  if l == nil then return nil end
  if type(l) ~= "table" then bad("logger") end
  for _, k in ipairs { "info", "warn", "error" } do
    if type(l[k]) ~= "function" then bad("logger." .. k) end
  end
  return l
end

-- The operator log's options (spec/operations.md 2-3), with its messages:
-- logFormat "text" | "json" (default: rich-mode.md 3's JSON lines),
-- logLevel, audit (default on).
local function log_options(opts)
  logmod.check_options { logFormat = opts.logFormat, logLevel = opts.logLevel, audit = opts.audit }
  return { logFormat = opts.logFormat, logLevel = opts.logLevel, audit = opts.audit }
end

local function memory(m)
  if m == nil then return { visibility = M.DEFAULTS.memoryVisibility } end
  if type(m) ~= "table" then bad("memory") end
  if m.promptBlock ~= nil and type(m.promptBlock) ~= "function" then bad("memory.promptBlock") end
  local v = m.visibility == nil and M.DEFAULTS.memoryVisibility or m.visibility
  if v ~= "private" and v ~= "shared" then bad("memory.visibility") end
  return { promptBlock = m.promptBlock, visibility = v }
end

local function host_identity(host)
  host = host or {}
  local uid, gid = core.getuid()
  if host.uid ~= nil then uid = host.uid end
  if host.gid ~= nil then gid = host.gid end
  local linux = host.linux
  if linux == nil then linux = runtime_options.is_linux() end
  return uid, gid, linux
end

-- Step 7, shared with resolve_broker.
local function broker_part(opts, turn_ms)
  local d = M.DEFAULTS
  local allow_http = opts.allowHttpMcp == true
  local upstream = M.endpoint(opts.upstream == nil and d.upstream or opts.upstream, false)
  if not upstream then fail(errors.RICH_ENDPOINT) end
  local servers, by_name, mcp_token = mcp_servers(opts.mcp, allow_http)
  local tools = host_tools(opts.tools)
  local max_calls = opts.maxCalls == nil and d.maxCalls or as_integer(opts.maxCalls)
  if not max_calls or max_calls < 1 or max_calls > M.MAX_CALLS then fail(errors.RICH_BUDGET) end
  local max_out = opts.maxOutputTokens == nil and d.maxOutputTokens or as_integer(opts.maxOutputTokens)
  if not max_out or max_out < M.MIN_OUTPUT or max_out > M.MAX_OUTPUT then fail(errors.RICH_OUTPUT) end
  local compaction = opts.compaction ~= nil and compactor(opts.compaction, turn_ms) or nil
  local retries = retry.check(opts.upstreamRetries)         -- the host's one retry policy (0-5, default 2)
  return {
    upstream = upstream, allowHttpMcp = allow_http, servers = servers, by_name = by_name,
    mcp_token = mcp_token, tools = tools, maxCalls = max_calls, maxOutputTokens = max_out,
    compaction = compaction, upstreamRetries = retries,
  }
end

-- The options of a broker alone (rich.broker): turnTimeoutMs (5), the
-- compactor's timeout (6), step 7, then model, oauthToken, servers (names
-- of mcp.servers; all when absent), the logger, fetchImpl and workerImage.
function M.resolve_broker(opts)
  if type(opts) ~= "table" then fail(errors.RICH_OPTIONS) end
  local turn_ms = deadline(opts.turnTimeoutMs, M.DEFAULTS.turnTimeoutMs)
  local c = opts.compaction
  if type(c) == "table" then
    local t = M.compactor_timeout(c, turn_ms)
    if type(t) == "number" and t > turn_ms / 2 then fail(errors.RICH_COMPACTOR_TIME) end
  end
  local b = broker_part(opts, turn_ms)
  if type(opts.model) ~= "string" or opts.model == "" or opts.model:find("[^\33-\126]") then bad("model") end
  if type(opts.oauthToken) ~= "function" then bad("oauthToken") end
  local servers = b.servers
  if opts.servers ~= nil then
    local names = list_of_strings(opts.servers)
    if not names then bad("servers") end
    servers = {}
    for i, n in ipairs(names) do
      servers[i] = b.by_name[n]
      if not servers[i] then fail(errors.RICH_MCP_MISSING .. n .. " unavailable") end
    end
  end
  if opts.fetchImpl ~= nil and type(opts.fetchImpl) ~= "function" then bad("fetchImpl") end
  if opts.workerImage ~= nil and type(opts.workerImage) ~= "string" then bad("workerImage") end
  return {
    model = opts.model, servers = servers, tools = b.tools, oauthToken = opts.oauthToken, mcpToken = b.mcp_token,
    upstream = b.upstream, fetchImpl = opts.fetchImpl, maxCalls = b.maxCalls, maxOutputTokens = b.maxOutputTokens,
    upstreamRetries = b.upstreamRetries, turnTimeoutMs = turn_ms, workerImage = opts.workerImage, compaction = b.compaction, logger = logger(opts.logger),
    log = log_options(opts),
  }
end

-- The first option name outside M.TABLE (in sorted order), or nil.
function M.unknown_name(opts)
  local names = {}
  for k in pairs(opts) do
    if not M.NAMES[k] then names[#names + 1] = tostring(k) end
  end
  table.sort(names)
  return names[1]
end

function M.resolve(opts, host)
  if type(opts) ~= "table" then fail(errors.RICH_OPTIONS) end
  local unknown = M.unknown_name(opts)
  if unknown then bad(unknown) end
  local d = M.DEFAULTS
  -- 1
  local dir = opts.partyDir
  if type(dir) ~= "string" or dir:sub(1, 1) ~= "/" or dir:find("^/+$") or dir:find("%z") then
    fail(errors.RICH_PARTY_DIR)
  end
  -- 2
  local uid, gid, linux = host_identity(host)
  if opts.driver == nil and not linux then fail(errors.RICH_LINUX) end
  -- 3
  if math.type(uid) ~= "integer" or math.type(gid) ~= "integer" or uid <= 0 or gid <= 0 then
    fail(errors.RICH_NON_ROOT)
  end
  -- 4
  local prefix = opts.containerPrefix == nil and d.containerPrefix or opts.containerPrefix
  if type(prefix) ~= "string" or #prefix > 41 or not prefix:find("^[a-z0-9][a-z0-9-]*$") then
    fail(errors.RICH_PREFIX)
  end
  -- 5
  local turn_ms = deadline(opts.turnTimeoutMs, d.turnTimeoutMs)
  local start_ms = deadline(opts.startTimeoutMs, d.startTimeoutMs)
  -- 6 (only a configured compactor has a timeout)
  local c = opts.compaction
  if type(c) == "table" then
    local t = M.compactor_timeout(c, turn_ms)
    if type(t) == "number" and t > turn_ms / 2 then fail(errors.RICH_COMPACTOR_TIME) end
  end
  -- 7
  local b = broker_part(opts, turn_ms)
  -- 8
  local zone = opts.timeZone == nil and d.timeZone or opts.timeZone
  if not runtime_options.time_zone_ok(zone) then fail(errors.RICH_TIME_ZONE) end
  -- the required options without a message of their own
  if type(opts.image) ~= "string" or opts.image == "" then bad("image") end
  local profs = profiles(opts.profiles)
  if type(opts.oauthToken) ~= "function" then bad("oauthToken") end
  if type(opts.effort) ~= "table" or type(opts.effort.judge) ~= "function" then bad("effort.judge") end
  local mem = memory(opts.memory)
  local log = logger(opts.logger)
  local log_opts = log_options(opts)
  if opts.driver ~= nil and type(opts.driver) ~= "table" then bad("driver") end
  if opts.fetchImpl ~= nil and type(opts.fetchImpl) ~= "function" then bad("fetchImpl") end
  for _, k in ipairs { "labelChannel", "labelProfile" } do
    local v = opts[k]
    if v ~= nil and (type(v) ~= "string" or v == "" or v:find("[^\33-\126]")) then bad(k) end
  end
  if opts.workerImage ~= nil and type(opts.workerImage) ~= "string" then bad("workerImage") end
  -- 9
  local made = core.fs_mkdir_p(dir, tonumber("700", 8))
  local st = made and core.fs_stat(dir)
  if not st or st.type ~= "dir" or st.uid ~= uid or st.mode & tonumber("077", 8) ~= 0 then
    fail(errors.RICH_PRIVATE)
  end
  local real = core.realpath(dir)
  if not real then fail(errors.RICH_PRIVATE) end
  return {
    partyDir = real, image = opts.image, profiles = profs, oauthToken = opts.oauthToken,
    memory = mem, effort = { judge = opts.effort.judge }, tools = b.tools,
    mcp = { servers = b.servers, by_name = b.by_name, token = b.mcp_token },
    upstream = b.upstream, fetchImpl = opts.fetchImpl, allowHttpMcp = b.allowHttpMcp, timeZone = zone,
    containerPrefix = prefix, labelChannel = opts.labelChannel or d.labelChannel,
    labelProfile = opts.labelProfile or d.labelProfile, driver = opts.driver, logger = log, log = log_opts,
    compaction = b.compaction, startTimeoutMs = start_ms, turnTimeoutMs = turn_ms,
    maxCalls = b.maxCalls, maxOutputTokens = b.maxOutputTokens, upstreamRetries = b.upstreamRetries,
    workerImage = opts.workerImage or opts.image, uid = uid, gid = gid,
  }
end

return M
