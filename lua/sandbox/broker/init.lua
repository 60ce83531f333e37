-- broker/init.lua: one sealed turn's broker (spec/broker.md). The C listener
-- (core.broker_listen) owns steps 0-12: framing, routes, header policy,
-- budget, in-flight, body and strict JSON. This file owns step 13: the three
-- route handlers, the apiKey hooks, the upstream call and the reply, and
-- step 14 (call:reply releases the in-flight slot when the handler settles).
--
-- A broker is bound at construction to one channel, one speaker (a copy made
-- now; later changes to the caller's table do not reach it) and one turn
-- signal. It is never reused: one broker, one budget, one turn.
local async = require "sandbox.async"
local broker_config = require "sandbox.broker._config"
local core = require "sandbox.core"
local credential = require "sandbox.broker._credential"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local model_payload = require "sandbox.broker._model_payload"
local signal = require "sandbox.signal"
local upstream = require "sandbox.broker._upstream"

local M = {}

M.FAILED = "broker call failed"
M.MCP_REFUSED = "MCP method or tool refused"
M.SOCKET_TOO_LONG = errors.SOCKET_TOO_LONG
-- The broker's bounds are the C core's (core/bounds.h), never restated here.
M.CALL_DEADLINE_MS = core.limits.CALL_DEADLINE_MS
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

-- opts: the broker configuration (model, modelUrl, allowHttp, tools, mcp,
-- maxCalls, maxOutputTokens, transport) plus the binding: apiKey, channel,
-- speaker and signal (the turn signal; a fresh one when absent) and audit
-- (optional function receiving one payload-free record per settled call).
function M.new(opts)
  return M.bind(broker_config.check(opts), opts)
end

-- A broker over a configuration broker/_config.check already returned (the
-- runtime checks it once at construction, not once per turn), bound to
-- b = {apiKey, channel, speaker, signal, audit} as in M.new.
function M.bind(cfg, b)
  if type(b.channel) ~= "string" then error("broker channel must be a string", 0) end
  local self = setmetatable({
    cfg = cfg,
    api_key = b.apiKey,
    channel = b.channel,
    speaker = copy_speaker(b.speaker),
    turn_signal = b.signal or signal.new(),
    audit = b.audit,
  }, Broker)
  self.route_list = self:_route_table()
  self.turn_signal:on_abort(function()
    if self.listener then self.listener:end_turn() end
  end)
  return self
end

-- The routes this broker serves, as data: { path, kind, handle(self, body,
-- sig, deadline) -> status[, body] }. The listener matches a request-target
-- against the paths in C (step 2) and hands on_call the index it matched.
function Broker:_route_table()
  local list = { { path = "/model", kind = "model",
                   handle = function(b, body, sig, deadline) return b:_model(body, sig, deadline) end } }
  for _, t in ipairs(self.cfg.tool_list) do
    list[#list + 1] = { path = "/tools/" .. t.name, kind = "tools",
                        handle = function(b, body, sig) return b:_tool(t, body, sig) end }
  end
  for _, s in ipairs(self.cfg.server_list) do
    list[#list + 1] = { path = "/mcp/" .. s.name, kind = "mcp",
                        handle = function(b, body, sig, deadline) return b:_mcp(s, body, sig, deadline) end }
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
  if self.speaker.principalId == "" then
    error("a broker is never started without a non-empty principalId", 0)
  end
  if self.listener then error("broker already started", 0) end
  if type(path) ~= "string" or #path > M.MAX_SOCKET_PATH then return nil, M.SOCKET_TOO_LONG end
  local listener, err = core.broker_listen {
    path = path,
    routes = self:routes(),
    max_calls = self.cfg.maxCalls,
    on_call = function(call, i) self:_dispatch(call, self.route_list[i]) end,
  }
  if not listener then return nil, err end
  self.listener = listener
  if self.turn_signal.aborted then listener:end_turn() end
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

-- POST /model (9.5-9.8)
function Broker:_model(body, sig, deadline)
  local cfg = self.cfg
  local forced, refused = model_payload.rebuild(body, cfg.model, cfg.maxOutputTokens)
  if not forced then return 400, refused end
  local key = credential.for_model(self.api_key, self:_scope(), sig)
  if not key then return 502 end
  local encoded = json.encode(forced)
  if not encoded then return 502 end
  local value = upstream.post_json({
    url = cfg.modelUrl,
    headers = { "Content-Type: application/json", "Accept: application/json",
                "Authorization: Bearer " .. key },
    body = encoded, deadline = deadline, allow_http = cfg.allowHttp,
    credential = key, transport = cfg.transport,
  }, sig)
  if value == nil then return 502 end
  return reply_json(value)
end

-- POST /tools/<name> (10)
function Broker:_tool(tool, body, sig)
  local ctx = { channel = self.channel, speaker = copy_speaker(self.speaker), signal = sig }
  local task = async.spawn(tool.run, body, ctx)
  -- Wait for the callback itself, not the signal: in-flight stays held until
  -- it returns, whatever happened to the connection.
  local ok, result = async.wait(task)
  if not ok or sig.aborted then return 502 end
  if type(result) ~= "string" or not json.utf8_valid(result) then return 502 end
  return reply_json(json.object({ "text" }, { text = result }))
end

-- POST /mcp/<server> (11)
function Broker:_mcp(server, body, sig, deadline)
  local params = body.params
  if body.method ~= "tools/call" or json.kind(params) ~= "object"
      or type(params.name) ~= "string" or server.tools[params.name] == nil
      or json.kind(params.arguments) ~= "object" then
    return 403, M.MCP_REFUSED
  end
  local mode, key = credential.for_mcp(server.apiKey, self:_scope(), sig)
  if mode == "error" then return 502 end
  local headers = { "Content-Type: application/json", "Accept: application/json, text/event-stream" }
  if mode == "key" then headers[#headers + 1] = "Authorization: Bearer " .. key end
  local encoded = json.encode(json.object({ "jsonrpc", "id", "method", "params" }, {
    jsonrpc = "2.0", id = 1, method = "tools/call",
    params = json.object({ "name", "arguments" }, { name = params.name, arguments = params.arguments }),
  }))
  if not encoded then return 502 end
  local value = upstream.post_json({
    url = server.url, headers = headers, body = encoded, deadline = deadline,
    allow_http = self.cfg.allowHttp, credential = key, transport = self.cfg.transport,
  }, sig)
  if value == nil then return 502 end
  return reply_json(value)
end

-- Called by the listener once steps 0-12 passed for an accepted call, with
-- the route it matched (step 13 runs that route's handler). Shared with the
-- precheck broker (lua/sandbox/precheck/_broker.lua) as M.dispatch: any
-- object with turn_signal and an optional audit, and routes of the same
-- shape, gets the same call signal, deadline and reply rules.
function Broker:_dispatch(call, route)
  local started = core.now()
  local deadline = started + M.CALL_DEADLINE_MS
  local sig = signal.child(self.turn_signal)
  local timer = core.timer(M.CALL_DEADLINE_MS, function() sig:abort("call deadline") end)
  call:on_close(function() sig:abort("client closed") end)
  local body = call:body()
  async.spawn(function()
    local ok, status, reply = pcall(route.handle, self, body, sig, deadline)
    timer:stop()
    sig:detach()
    if not ok or type(status) ~= "number" or (status == 200 and sig.aborted) then
      status, reply = 502, nil
    end
    if status ~= 200 and reply == nil then reply = M.FAILED end
    call:reply(status, reply)
    if self.audit then
      pcall(self.audit, { route = route.kind, status = status, ms = core.now() - started })
    end
  end)
end

M.dispatch = Broker._dispatch

return M
