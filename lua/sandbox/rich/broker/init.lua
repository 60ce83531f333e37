-- rich/broker/init.lua: one channel's broker (PiSandboxBroker, spec/rich-mode.md
-- 8-14): the stream-mode listener on the channel's run/broker.sock, the order
-- of checks of section 9, the scopes (the startup scope, the bound turn), the
-- worker transport, and the credential-bearing routes (model, host tools,
-- MCP). It lives as long as the channel's container, across turns; bind()
-- gives it a turn's identity and release() takes it away again.
--
--   local b = broker.new(cfg)            cfg: see M.new
--   b:listen(path) -> true | nil, err    (any old socket file must be gone)
--   b.ready                               the worker posted /worker/ready
--   local release = b:bind{channel, profile, speaker, thinking, signal, deadline}
--   b:execute(request, signal) -> {ok, text, files} | {ok=false, error}   (yields; raises)
--   b:stop()                              force: every socket destroyed, the server closed
--
-- Section 15's two routes are rich/broker/_compaction.lua.
local anthropic = require "sandbox.providers.anthropic_messages"
local audit = require "sandbox.rich.broker._audit"
local compaction = require "sandbox.rich.broker._compaction"
local core = require "sandbox.core"
local json = require "sandbox.json"
local log = require "sandbox.rich._log"
local mcp = require "sandbox.rich.broker._mcp"
local model = require "sandbox.rich.broker._model"
local scope = require "sandbox.rich.broker._scope"
local signal = require "sandbox.signal"
local stream = require "sandbox.rich.broker._http"
local tools = require "sandbox.rich.broker._tools"
local transport = require "sandbox.rich._transport"
local worker = require "sandbox.rich.broker._worker"

local M = {}

M.NOT_FOUND = "Not found"
M.TURN_ENDED = "Turn ended"
M.BUDGET = "Broker budget exhausted"
M.BAD_INPUT = "Invalid input"
M.MAX_BODY = 96 * 1024 * 1024
-- Claude Code's reachability check of ANTHROPIC_BASE_URL (`HEAD /anthropic`,
-- before and between turns): the worker transport's own machinery, answered
-- 200 with no body and never audited, so a healthy turn logs no refusal
-- (operations.md 5). Any other method or target there stays a refusal.
M.PREFLIGHT = "/anthropic"
M.DEFAULT_CLOCK = { now = core.now, timer = core.timer }

local Broker = {}
Broker.__index = Broker

-- cfg (resolved by rich/_options.lua): model, servers = {{name, url, tools,
-- tool_set}}, tools = {names, set, call}, oauthToken, mcpToken, upstream,
-- fetch (a fetchImpl-shaped transport), maxCalls, maxOutputTokens,
-- turnTimeoutMs, workerImage, compaction ({engine, compact, timeoutMs,
-- maxRequestBytes}) or compaction_engine alone, logger (rich/_log.lua: the
-- operator logger and the recorder the audit lines come from), profile,
-- channel (the audit lines'; the scope's when absent); seams for specs and
-- benches: clock = {now, timer}, idleMs, headerTimeoutMs, trace (a function
-- given one payload-free record per settled budgeted call {route, ms} and per
-- turn handed out / result accepted {event, at}).
function M.new(cfg)
  local clock = cfg.clock or M.DEFAULT_CLOCK
  local servers, by_name = {}, {}
  for i, s in ipairs(cfg.servers or {}) do servers[i] = s; by_name[s.name] = s end
  local self = setmetatable({
    model = cfg.model, profile = cfg.profile, servers = servers, server_by_name = by_name,
    tools = cfg.tools or { names = {}, set = {} }, oauthToken = cfg.oauthToken, mcpToken = cfg.mcpToken,
    upstream = cfg.upstream, fetch = cfg.fetch or transport.new(nil),
    maxCalls = cfg.maxCalls, maxOutputTokens = cfg.maxOutputTokens, turnTimeoutMs = cfg.turnTimeoutMs,
    workerImage = cfg.workerImage, compaction = cfg.compaction,
    compaction_engine = cfg.compaction_engine or (cfg.compaction and cfg.compaction.engine),
    log = cfg.logger or log.new(nil), clock = clock, idle_ms = cfg.idleMs, header_timeout_ms = cfg.headerTimeoutMs,
    trace = cfg.trace, channel = cfg.channel, upstreamRetries = cfg.upstreamRetries,
    ready = false, caps = { privateTo = false, readerRecords = false }, requirement = false,
    bound = nil, poll = nil, pending = nil, receiving = false,
  }, Broker)
  self.startup = scope.startup(clock.now())                      -- 13.3: armed at construction
  self.armed_at = clock.now()
  return self
end

function Broker:listen(path)
  if self.server then error("broker already listening", 0) end
  local server, err = stream.listen {
    path = path, idle_ms = self.idle_ms, header_timeout_ms = self.header_timeout_ms,
    on_request = function(conn) self:_serve(conn) end,
    on_refused = function(reason, status) audit.c_refused(self, reason, status) end,
  }
  if not server then return nil, err end
  self.server = server
  return true
end

function Broker:stop()
  if self.server then self.server:stop(true) end
  self.server = nil
  if self.poll and self.poll.wake then self.poll.wake() end
end

-- bind (9): one turn at a time; the startup scope is revoked.
function Broker:bind(ctx)
  if self.bound then error(require("sandbox.errors").RICH_BOUND, 0) end
  local s = scope.turn(ctx, self.maxCalls)
  self.bound = s
  if self.startup then self.startup.gone = true end
  self.startup = nil
  return function()
    if self.bound == s then self.bound = nil end
  end
end

function Broker:execute(request, sig)
  return worker.execute(self, request, sig)
end

-- 13.3: ready and discovery arm a fresh startup scope only when no turn is
-- bound, the present one is gone, expired or used up, and over 10 s passed
-- since the previous arming.
function Broker:_rearm()
  local now = self.clock.now()
  if self.bound then return false end
  local s = self.startup
  if s and not s.gone and now < s.expires and s.remaining > 0 then return false end
  if now - self.armed_at <= scope.REARM_SPACING_MS then return false end
  self.startup = scope.startup(now)
  self.armed_at = now
  return true
end

function Broker:_trace(record)
  if self.trace then pcall(self.trace, record) end
end

function Broker:stats()
  local s = self.bound or self.startup
  return {
    ready = self.ready, bound = self.bound ~= nil, pending = self.pending ~= nil,
    scope = s and s.kind or nil, remaining = s and s.remaining or nil, active = s and s.active or nil,
    requirement = self.requirement,
  }
end

-- Step 7: tool = text after /tools/; server = the name after /mcp/; model =
-- exactly the two message paths.
local function classify(path)
  if model.PATHS[path] then return { kind = "model" } end
  local tool = path:match("^/tools/(.+)$")
  if tool then return { kind = "tool", name = tool } end
  local server = path:match("^/mcp/(.+)$")
  if server then return { kind = "mcp", name = server } end
  return nil
end

-- Step 12's shapes: what each handler reads; the rest is dropped unread.
local SHAPES = { model = anthropic.SHAPE, tool = tools.SHAPE, mcp = mcp.SHAPE }

-- Step 12: the body, at most 96 MiB, strict UTF-8 JSON, 64 levels, an
-- object; or nil and the audit reason.
local function read_object(conn, sig, rec, shape)
  local bytes, why = conn:body(M.MAX_BODY, sig)
  if not bytes then
    why = tostring(why)
    if why:find("^EFBIG") then return nil, "body_too_large" end
    if why:find("^ETIMEDOUT") then return nil, "request_deadline" end
    if why == "aborted" then return nil, sig.reason == "deadline" and "request_deadline" or "after_turn" end
    return nil, "client_closed"
  end
  rec.bytes_in = #bytes
  local v, err = json.decode_body(bytes, shape)       -- shape first, bounded (issue 21)
  bytes = nil
  if v == nil and err == "too large" then return nil, "body_too_large" end
  if json.kind(v) ~= "object" then return nil, "malformed_json" end
  return v
end

-- Steps 11-13 of an admitted call, and the slot it holds until it settles.
function Broker:_call(conn, s, route, path, beta)
  local started = self.clock.now()
  local call = { scope = s, path = path, beta = beta, started = started }
  local rec = audit.begin(self, s, audit.route(route.kind, path), call)
  local sig = signal.new()
  local hooks = {
    s.signal:on_abort(function(r) sig:abort(r) end),
    conn.signal:on_abort(function(r) sig:abort(r) end),
  }
  local deadline = scope.deadline(s, self.turnTimeoutMs)
  local timer = self.clock.timer(math.max(0, math.ceil(deadline - started)), function() sig:abort("deadline") end)
  call.signal, call.deadline = sig, deadline
  local ok, err = pcall(function()
    local body, why = read_object(conn, sig, rec, SHAPES[route.kind])
    if not body then
      rec.reason = why
      return conn:reply(400, M.BAD_INPUT)
    end
    call.body = body
    if route.kind == "model" then
      return model.handle(self, conn, call)
    elseif route.kind == "tool" then
      call.name = route.name
      return tools.handle(self, conn, call)
    end
    call.server = self.server_by_name[route.name]
    return mcp.handle(self, conn, call)
  end)
  timer:stop()
  for _, unhook in ipairs(hooks) do unhook() end
  scope.settle(s)
  self:_trace { route = route.kind, ms = self.clock.now() - started }
  if not ok then
    self.log.error("sandbox broker handler failed", { channel = s.channel, turn = s.turnId, route = route.kind, error = tostring(err):sub(1, 300) })
    conn:fail()
  end
  audit.finish(self, rec, conn)
end

-- A refusal before admission (steps 1, 4-10): the answer and its audit line.
local function refuse(self, conn, s, status, body, reason, route)
  conn:reply(status, body)
  audit.refused(self, s, status, reason, route)
end

-- One request, in the order of section 9.
function Broker:_serve(conn)
  local target = conn.target
  local qpos = target:find("?", 1, true)
  local path = qpos and target:sub(1, qpos - 1) or target
  local query = qpos and target:sub(qpos + 1) or nil
  if target:find("#", 1, true) or (query ~= nil and query ~= "beta=true") then      -- 1
    return refuse(self, conn, self.bound, 404, M.NOT_FOUND, "query")
  end
  if path:sub(1, 8) == "/worker/" and query == nil then return worker.route(self, conn, path) end  -- 2
  if conn.method == "HEAD" and path == M.PREFLIGHT and query == nil then                 -- 2a
    return conn:reply(200, "")   -- the worker's own preflight: no body, budget, credential or audit line
  end
  if path == "/mcp-tools" and conn.method == "GET" and query == nil then return mcp.discovery(self, conn) end  -- 3
  if (path == "/compaction/compact" or path == "/compaction/report") and query == nil then  -- 4
    return compaction.route(self, conn, path)
  end
  local s = self.bound or self.startup                                               -- 5
  if not scope.usable(s, self.clock.now()) then
    return refuse(self, conn, s or self.bound, 410, M.TURN_ENDED, "after_turn")
  end
  local problem = worker.enforce(self, s)                                             -- 6
  if problem then return refuse(self, conn, s, 410, problem, "after_turn") end
  local route = classify(path)                                                        -- 7
  local known = route and (route.kind == "model"
    or (route.kind == "tool" and self.tools.set[route.name])
    or (route.kind == "mcp" and self.server_by_name[route.name])) and audit.route(route.kind, path) or nil
  if s.kind == "startup" and not (route and route.kind == "mcp") then                 -- 8
    return refuse(self, conn, s, 410, M.TURN_ENDED, "not_bound", known)
  end
  if conn.method ~= "POST" or not known or (route.kind ~= "model" and query ~= nil) then  -- 9
    local why = not known and "unknown_route" or conn.method ~= "POST" and "method" or "query"
    return refuse(self, conn, s, 404, M.NOT_FOUND, why, known)
  end
  if not scope.admit(s) then                                                          -- 10, 11
    return refuse(self, conn, s, 429, M.BUDGET, s.remaining <= 0 and "budget" or "busy", known)
  end
  return self:_call(conn, s, route, path, query ~= nil)                               -- 12, 13
end

return M
