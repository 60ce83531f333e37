-- broker/init.lua: one sealed turn's broker (spec/broker.md). The C listener
-- (core.broker_listen) owns steps 0-12: framing, routes, header policy,
-- budget, in-flight, body and strict JSON. This file owns step 13: the three
-- route handlers, the apiKey hooks, the upstream call and the reply, and
-- step 14 (call:reply releases the in-flight slot when the handler settles).
--
-- A broker is bound at construction to one channel, one speaker (a copy made
-- now; later changes to the caller's table do not reach it) and one turn
-- signal. It is never reused: one broker, one budget, one turn. A warm
-- turn's broker (M.unbound) is started before its turn and bound once when
-- the turn arrives; until then it answers 503 `broker not ready`.
--
-- Every request makes one call record (sandbox/ops/record.lua): the calls
-- that reach a handler here, and the ones the listener refused at steps
-- 0-12 (it hands their reason over as data, on_refused). The record goes to
-- the binding's recorder once the call settled; the runtime's reader writes
-- the audit line and the turn decides its reason from them. The model route
-- sends the credential as modelAuth says (spec/providers.md 1): Bearer,
-- `api-key`, or nothing at all (then apiKey is never called and the
-- reflection filter has nothing to look for).
local async = require "sandbox.async"
local budget = require "sandbox.broker._budget"
local broker_config = require "sandbox.broker._config"
local core = require "sandbox.core"
local credential = require "sandbox.broker._credential"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local openai_chat = require "sandbox.providers.openai_chat"
local record = require "sandbox.ops.record"
local retry = require "sandbox.broker._retry"
local signal = require "sandbox.signal"
local upstream = require "sandbox.broker._upstream"
local upstream_error = require "sandbox.broker._upstream_error"

local M = {}

M.FAILED = "broker call failed"
M.MCP_REFUSED = "MCP method or tool refused"
M.SOCKET_TOO_LONG = errors.SOCKET_TOO_LONG
-- The broker's bounds are the C core's (core/bounds.h), never restated here.
M.CALL_DEADLINE_MS = core.limits.CALL_DEADLINE_MS
M.REQUEST_DEADLINE_MS = core.limits.REQUEST_DEADLINE_MS
M.DEADLINE_MARGIN_MS = 2000
M.MAX_REPLY_BYTES = core.limits.MAX_REPLY_BYTES
M.MAX_SOCKET_PATH = core.limits.MAX_SOCKET_PATH

local Broker = {}
Broker.__index = Broker

local function copy_speaker(sp)
  if type(sp) ~= "table" then error("broker speaker must be a table {id, name, principalId}", 0) end
  local function field(name)
    local v = sp[name]
    if v == nil then return "" end
    if type(v) ~= "string" then error("broker speaker." .. name .. " must be a string", 0) end
    return v
  end
  return { id = field("id"), name = field("name"), principalId = field("principalId") }
end

-- opts: the broker configuration (model, modelUrl, allowHttp, modelAuth,
-- maxOutputTokens, outputTokensField, tools, mcp, maxCalls, transport) plus
-- the binding: apiKey, channel, speaker and signal (the turn signal; a fresh
-- one when absent), and for the records: recorder (sandbox/ops/record.lua),
-- turn (the turn record whose counters the calls move, or nil) and turnId.
function M.new(opts)
  local cfg = broker_config.check(opts)
  if cfg.modelAuth == "none" and opts.apiKey ~= nil then error(errors.API_KEY_UNUSED, 0) end
  return M.bind(cfg, opts)
end

-- The binding's fields (M.bind, Broker:bind): apiKey, speaker, turn signal,
-- recorder, turn record, turn id.
local function set_binding(self, b)
  self.api_key = b.apiKey
  self.budget = b.budget
  self.speaker = copy_speaker(b.speaker)
  self.turn_signal = b.signal or signal.new()
  self.recorder = b.recorder or self.recorder
  self.turn = b.turn
  -- every line about a turn carries its id: a broker made alone (sbx
  -- broker, a spec) gets one of its own
  self.turn_id = b.turnId or (b.turn and b.turn.turn) or self.turn_id or record.turn_id()
  self.turn_signal:on_abort(function()
    if self.listener then self.listener:end_turn() end
  end)
end

-- A broker over a configuration broker/_config.check already returned (the
-- runtime checks it once at construction, not once per turn), bound to
-- b = {apiKey, channel, speaker, signal, recorder, turn, turnId} as in M.new.
function M.bind(cfg, b)
  if type(b.channel) ~= "string" then error("broker channel must be a string", 0) end
  local self = setmetatable({ cfg = cfg, channel = b.channel }, Broker)
  self.route_list = self:_route_table()
  set_binding(self, b)
  return self
end

-- A warm turn's broker (spec/warm-turns.md 1): made and started before its
-- turn for one channel, unbound: until :bind every request is answered 503
-- `broker not ready` by the listener (its audit reason not_bound), spends
-- no budget and calls no hook. o = {channel=, recorder=}.
function M.unbound(cfg, o)
  if type(o.channel) ~= "string" then error("broker channel must be a string", 0) end
  local self = setmetatable({ cfg = cfg, channel = o.channel, recorder = o.recorder, unbound = true,
    turn_id = record.turn_id() }, Broker)
  self.route_list = self:_route_table()
  return self
end

-- Binds an unbound, started broker to its turn: b as in M.bind, for the
-- channel it was made for. Exactly once; a second bind is a programming
-- error (warm-turns.md 1).
function Broker:bind(b)
  if not self.unbound then error("broker already bound", 0) end
  if b.channel ~= self.channel then error("a warm broker is bound only to its own channel", 0) end
  if type(b.speaker) ~= "table" or type(b.speaker.principalId) ~= "string" or b.speaker.principalId == "" then
    error("a broker is never bound without a non-empty principalId", 0)
  end
  if not self.listener then error("a warm broker is bound once started", 0) end
  self.turn_id = nil
  set_binding(self, b)
  self.unbound = nil
  self.listener:bind()
  if self.turn_signal.aborted then self.listener:end_turn() end
end

-- The routes this broker serves, as data: { path, kind, handle(self, body,
-- sig, deadline, rec) -> status[, body] } (rec: the call record). The listener matches a request-target
-- against the paths in C (step 2) and hands on_call the index it matched.
function Broker:_route_table()
  local list = { { path = "/model", kind = "model",
                   handle = function(b, body, sig, deadline, rec) return b:_model(body, sig, deadline, rec) end } }
  for _, t in ipairs(self.cfg.tool_list) do
    list[#list + 1] = { path = "/tools/" .. t.name, kind = "tools",
                        handle = function(b, body, sig, _, rec) return b:_tool(t, body, sig, rec) end }
  end
  for _, s in ipairs(self.cfg.server_list) do
    list[#list + 1] = { path = "/mcp/" .. s.name, kind = "mcp",
                        handle = function(b, body, sig, deadline, rec) return b:_mcp(s, body, sig, deadline, rec) end }
  end
  return list
end

-- The exact request-targets this broker serves.
function Broker:routes()
  local paths = {}
  for i, r in ipairs(self.route_list) do paths[i] = r.path end
  return paths
end

-- Binds the socket and starts serving. Returns true, or nil and a message.
function Broker:start(path)
  if not self.unbound and self.speaker.principalId == "" then
    error("a broker is never started without a non-empty principalId", 0)
  end
  if self.listener then error("broker already started", 0) end
  if type(path) ~= "string" or #path > M.MAX_SOCKET_PATH then return nil, M.SOCKET_TOO_LONG end
  local listener, err = core.broker_listen {
    path = path,
    routes = self:routes(),
    max_calls = self.cfg.maxCalls,
    unbound = self.unbound == true,
    header_timeout_ms = self.cfg.listen and self.cfg.listen.header_ms or nil,
    request_timeout_ms = self.cfg.listen and self.cfg.listen.request_ms or nil,
    on_call = function(call, i, n) self:_dispatch(call, self.route_list[i], n) end,
    on_refused = function(r) self:_refused(r) end,
  }
  if not listener then return nil, err end
  self.listener = listener
  if self.turn_signal and self.turn_signal.aborted then listener:end_turn() end
  return true
end

-- Ends the turn: every route answers 410 from now on and the signals of calls
-- still running abort.
function Broker:end_turn(reason)
  self.turn_signal:abort(reason or "turn ended")
end

-- Forced stop: every connection destroyed, the socket closed and unlinked.
function Broker:stop()
  if self.listener then self.listener:stop() end
end

function Broker:stats()
  return self.listener and self.listener:stats() or nil
end

function Broker:_scope()
  return credential.scope(self.channel, self.speaker)
end

local function reply_json(value)
  local out = json.encode(value, M.MAX_REPLY_BYTES)
  if out == nil then return 502 end
  return 200, out
end

-- Copies an upstream outcome into the call record rec: the reason, the
-- upstream's status, time and tokens, and the fix an operator applies.
local function note_upstream(rec, reason, info, fix_ctx)
  rec.upstream_status = info.status
  rec.upstream_ms = info.ms
  rec.cause = info.cause
  rec.request_id = info.request_id
  rec.tries = info.tries
  if reason == nil then return end
  rec.reason = reason ~= "aborted" and reason or nil
  if reason == "upstream_status" then
    rec.code, rec.type, rec.param = info.code, info.type, info.param
    rec.fix = upstream_error.fix(info.status, info, fix_ctx)
  elseif reason == "reflection" then
    rec.fix = errors.reason_fix("reflection")
  end
end

-- The upstream request of a model call for cfg, with the credential as
-- modelAuth says (nil under "none"). Returns the decoded reply and info, or
-- nil, the reason and info (broker/_upstream.lua). The /model route and
-- `sbx doctor --probe` make model calls only through this.
function M.model_call(cfg, key, forced, sig, deadline)
  local encoded = json.encode(forced)
  if not encoded then return nil, "upstream_invalid", {} end
  local headers = openai_chat.auth_headers(cfg.modelAuth, key)
  local opts = {
    url = cfg.modelUrl, headers = headers, body = encoded, deadline = deadline,
    allow_http = cfg.allowHttp, credential = cfg.modelAuth ~= "none" and key or nil,
    transport = cfg.transport,
  }
  -- the host's retry policy (broker/_retry.lua): 429, 5xx, never sent
  local retries, try = cfg.upstreamRetries or retry.DEFAULT, 0
  while true do
    try = try + 1
    local value, reason, info = upstream.post_json(opts, sig)
    info.tries = try
    if value ~= nil or try > retries or not retry.retryable(reason, info) then return value, reason, info end
    local wait = retry.delay_ms(try, info)
    if core.now() + wait >= deadline or not async.sleep_or_abort(wait, sig) then return value, reason, info end
  end
end

-- cfg with one modelFallbacks entry's endpoint and model in place.
function M.fallback_config(cfg, f)
  local c = setmetatable({}, { __index = cfg })
  c.modelUrl, c.model, c.modelHost = f.modelUrl, f.model, f.modelHost
  return c
end

-- The fix context of cfg's model route (upstream_error.fix).
function M.fix_context(cfg, kind)
  return { route_kind = kind or "model", modelAuth = cfg.modelAuth, host = cfg.modelHost }
end

-- POST /model (9.5-9.8; providers.md 1-2)
function Broker:_model(body, sig, deadline, rec)
  local cfg = self.cfg
  local forced, refused = openai_chat.rebuild(body, cfg.model, cfg.maxOutputTokens, cfg.outputTokensField)
  if not forced then
    rec.reason = "payload"
    return 400, refused
  end
  if self.budget then                         -- the operator's budget hook
    local allowed, why = budget.allows(self.budget,
      budget.scope(self.channel, self.speaker, self.turn_id, "model_call", self.turn), sig)
    if not allowed then
      if why ~= "aborted" then rec.reason, rec.budget_error = "budget_exceeded", why == "raised" or nil end
      return 502
    end
  end
  -- the configured endpoint, then each of modelFallbacks while the one
  -- before it failed in a way the retry policy would retry (exhausted)
  local value, reason, info, used
  for i = 0, #cfg.fallbacks do
    used = i == 0 and cfg or M.fallback_config(cfg, cfg.fallbacks[i])
    local key
    if cfg.modelAuth ~= "none" then
      local why
      local scope = self:_scope()
      -- with fallbacks the hook learns which endpoint it keys (0: modelUrl)
      if #cfg.fallbacks > 0 then scope.endpoint = { url = used.modelUrl, model = used.model, fallback = i } end
      key, why = credential.for_model(self.api_key, scope, sig)
      if not key then
        rec.reason = why
        return 502
      end
    end
    if i > 0 then forced.model = used.model end
    value, reason, info = M.model_call(used, key, forced, sig, deadline)
    if value ~= nil or sig.aborted or not retry.retryable(reason, info) then break end
  end
  if used ~= cfg then rec.fallback = used.modelHost or "fallback" end
  note_upstream(rec, reason, info, M.fix_context(used))
  if value == nil then return 502 end
  rec.reply = openai_chat.reply_facts(value)
  rec.usage = rec.reply.usage
  return reply_json(value)
end

-- POST /tools/<name> (10)
function Broker:_tool(tool, body, sig, rec)
  local ctx = { channel = self.channel, speaker = copy_speaker(self.speaker), signal = sig }
  local task = async.spawn(tool.run, body, ctx)
  -- Wait for the callback itself, not the signal: in-flight stays held until
  -- it returns, whatever happened to the connection.
  local ok, result = async.wait(task)
  if sig.aborted then return 502 end
  if not ok or type(result) ~= "string" or not json.utf8_valid(result) then
    rec.reason = "tool_failed"
    return 502
  end
  return reply_json(json.object({ "text" }, { text = result }))
end

-- POST /mcp/<server> (11)
function Broker:_mcp(server, body, sig, deadline, rec)
  local params = body.params
  if body.method ~= "tools/call" or json.kind(params) ~= "object"
      or type(params.name) ~= "string" or server.tools[params.name] == nil
      or json.kind(params.arguments) ~= "object" then
    rec.reason = "payload"
    return 403, M.MCP_REFUSED
  end
  local mode, key = credential.for_mcp(server.apiKey, self:_scope(), sig)
  if mode == "error" then
    rec.reason = key
    return 502
  end
  local headers = { "Content-Type: application/json", "Accept: application/json, text/event-stream" }
  if mode == "key" then headers[#headers + 1] = "Authorization: Bearer " .. key end
  local encoded = json.encode(json.object({ "jsonrpc", "id", "method", "params" }, {
    jsonrpc = "2.0", id = 1, method = "tools/call",
    params = json.object({ "name", "arguments" }, { name = params.name, arguments = params.arguments }),
  }))
  if not encoded then return 502 end
  local value, reason, info = upstream.post_json({
    url = server.url, headers = headers, body = encoded, deadline = deadline,
    allow_http = self.cfg.allowHttp, credential = key, transport = self.cfg.transport,
  }, sig)
  note_upstream(rec, reason, info, { route_kind = "mcp" })
  if value == nil then return 502 end
  return reply_json(value)
end

-- Hands a settled call record to the recorder (which writes the audit
-- line and moves the turn's counters). Never raises.
local function settle(self, rec)
  if self.recorder then pcall(self.recorder.call, self.recorder, self.turn, rec) end
end
Broker._settle = settle

-- A request the listener refused at steps 0-12, as data (core/API.md
-- broker_listen on_refused). Runs on the loop, never yields.
function Broker:_refused(r)
  local route = r.route and self.route_list[r.route] or nil
  local rec = record.call(self.channel, self.turn_id, route and route.path, route and route.kind)
  rec.status, rec.reason, rec.header = r.status, r.reason, r.header
  rec.accepted = r.accepted == true
  rec.ms = 0
  settle(self, rec)
end

-- Shared with the precheck broker as M.refused: any object with
-- route_list (the routes as data), channel, turn_id and recorder.
M.refused = Broker._refused

-- Called by the listener once steps 0-12 passed for an accepted call, with
-- the route it matched (step 13 runs that route's handler) and the body's
-- byte length. Shared with the precheck broker (lua/sandbox/precheck/_broker.lua)
-- as M.dispatch: any object with turn_signal (and, optionally, cfg, recorder,
-- channel, turn_id), and routes of the same shape, gets the same call
-- signal, deadline and reply rules.
function Broker:_dispatch(call, route, nbytes)
  local started = core.now()
  local listen = self.cfg and self.cfg.listen or {}
  local call_ms = listen.call_ms or M.CALL_DEADLINE_MS
  -- The handler's own work (the upstream call above all) ends a margin
  -- before the earlier of the call deadline and the listener's request
  -- deadline (which runs from head completion, a moment before acceptance):
  -- when the listener closed the connection first, the operator saw the
  -- worker fail instead of upstream_timeout.
  local window = math.min(call_ms, listen.request_ms or M.REQUEST_DEADLINE_MS)
  local deadline = started + window - math.min(M.DEADLINE_MARGIN_MS, window // 10)
  local sig = signal.child(self.turn_signal)
  local rec = record.call(self.channel, self.turn_id, route.path, route.kind)
  rec.accepted, rec.bytes_in = true, nbytes
  local closed
  local timer = core.timer(call_ms, function() sig:abort(upstream.CALL_DEADLINE_REASON) end)
  call:on_close(function(why)
    closed = why
    sig:abort("client closed")
  end)
  local body = call:body()
  async.spawn(function()
    local ok, status, reply = pcall(route.handle, self, body, sig, deadline, rec)
    timer:stop()
    local aborted = sig.aborted
    sig:detach()
    if not ok or type(status) ~= "number" or (status == 200 and aborted) then
      status, reply = 502, nil
    end
    if status ~= 200 and reply == nil then reply = M.FAILED end
    local written = call:reply(status, reply)
    rec.status = written and status or 0
    rec.bytes_out = written and #reply or 0
    if closed then rec.reason = rec.reason or closed
    elseif aborted and rec.reason == nil and status ~= 200 then
      rec.reason = self.turn_signal.aborted and "after_turn" or "request_deadline"
    end
    settle(self, rec)
  end)
end

M.dispatch = Broker._dispatch

return M
