-- precheck/_broker.lua: one precheck run's broker (shared/spec/precheck.md 5).
-- It forwards single MCP `tools/call` requests of a granted, approved tool to
-- that server, swapping the host token in on the host, and answers with the
-- upstream's JSON-RPC message alone.
--
-- The shared listener (core.broker_listen with policy "precheck") owns rows
-- 0-9: framing, the 10 s / 60 s deadlines, the 16-connection cap, exact
-- routes, the header policy, 410/409/429, the budget, the 64 KiB body and
-- strict JSON (core/precheck_head.c decides the head). This file owns rows
-- 10-17 as the route handler; the call signal, the 60 s call deadline and
-- the reply rules are the sealed broker's dispatcher (lua/sandbox/broker,
-- M.dispatch), the upstream call is broker/_upstream.lua's (libcurl), the
-- token hook runs like an apiKey hook (broker/_credential.lua) and the
-- needles are core/reflect.c's six forms.
--
--   local b = precheck_broker.start(path, servers, {maxCalls=, signal=,
--     scope=, allowHttp=, fetchImpl=, recorder=, run=})   -> broker | nil, err
--   b:stats()  b:stop()
--
-- servers: the run's filtered grant {name, url, tools={...}, token=fn|nil}.
-- Every request makes one call record (sandbox/ops/record.lua), as the
-- sealed broker's do: the listener's refusals (rows 0-9) through
-- broker.refused, the accepted calls through broker.dispatch, with the
-- reason of rows 10-16 set here (payload, credential_missing/_error,
-- upstream_*, reflection). The runner's recorder turns them into the audit
-- lines of spec/operations.md 3, with channel = the schedule's channel and
-- turn = the run id.
-- Nothing here logs a URL, header, token or payload; no refusal carries one.
local broker = require "sandbox.broker"
local core = require "sandbox.core"
local credential = require "sandbox.broker._credential"
local json = require "sandbox.json"
local message = require "sandbox.precheck._message"
local upstream = require "sandbox.broker._upstream"

local M = {}

M.MAX_BODY = 65536
M.MAX_UPSTREAM_BYTES = upstream.MAX_BODY                 -- 1 MiB
M.FAILED = broker.FAILED                                 -- "broker call failed"
M.MCP_REFUSED = broker.MCP_REFUSED                       -- "MCP method or tool refused"
M.UPSTREAM_REFUSED = "upstream refused"
M.REFLECTED = "credential reflected"
M.NO_MESSAGE = "upstream returned no JSON-RPC message"

local Broker = {}
Broker.__index = Broker

-- Row 10: a single tools/call of one of this server's run tools; arguments
-- absent or an object. Returns the tool name and arguments, or nil.
local function accepted_call(server, body)
  if json.kind(body) ~= "object" or body.method ~= "tools/call" then return nil end
  local params = body.params
  if json.kind(params) ~= "object" or type(params.name) ~= "string" then return nil end
  if not server.tool_set[params.name] then return nil end
  local args = params.arguments
  if args == nil then return params.name, json.object({}, {}) end
  if json.kind(args) ~= "object" then return nil end
  return params.name, args
end

-- Row 11: the token hook, on the host, bounded by the call signal. Returns
-- the token ("" for none), or nil and the record's reason when the hook
-- raised (credential_error), gave a bad value (credential_missing) or was
-- cut by the call signal (nil).
function Broker:_token(server, sig)
  if server.token == nil then return "" end
  local hook = server.token
  local scope = {}
  for k, v in pairs(self.scope) do scope[k] = v end
  local status, value = credential.call_hook(function(s) return hook(s, { signal = sig }) end, scope, sig)
  if status ~= "ok" then return nil, value == "raised" and "credential_error" or nil end
  if type(value) ~= "string" or value:find("[\r\n%z]") then return nil, "credential_missing" end
  return value
end

-- Row 12: the upstream POST (or the fetchImpl seam). Returns {status, body,
-- content_type} for a 2xx, or nil, the refusal body of rows 12/13 and the
-- record's reason; rec.upstream_status gets the status when one came.
function Broker:_post(server, headers, body, sig, deadline, rec)
  if self.fetchImpl then
    local hdrs = {}
    for _, line in ipairs(headers) do
      local name, value = line:match("^([^:]+): (.*)$")
      hdrs[name] = value
    end
    local ok, res = pcall(self.fetchImpl, { url = server.url, method = "POST", headers = hdrs, body = body }, sig)
    if not ok or sig.aborted or type(res) ~= "table" or math.type(res.status) ~= "integer" then
      return nil, M.FAILED, (not sig.aborted) and "upstream_unreachable" or nil
    end
    rec.upstream_status = res.status
    if res.status >= 300 and res.status <= 399 then return nil, M.FAILED, "upstream_status" end
    if res.status < 200 or res.status > 299 then return nil, M.UPSTREAM_REFUSED, "upstream_status" end
    if type(res.body) ~= "string" or #res.body > M.MAX_UPSTREAM_BYTES then return nil, M.FAILED, "upstream_invalid" end
    return { status = res.status, body = res.body, content_type = res.contentType }
  end
  local res, why, status = upstream.post({
    url = server.url, headers = headers, body = body, deadline = deadline,
    allow_http = self.allowHttp, content_type = true,
  }, sig)
  rec.upstream_status = status or (res and res.status)
  if res then return res end
  local reason = upstream.reason_of(why)
  if why == "status" and status and (status < 300 or status > 399) then
    return nil, M.UPSTREAM_REFUSED, reason
  end
  return nil, M.FAILED, reason
end

-- Rows 10-17 for one accepted call to `server`. Returns status[, body];
-- rec (the call record) gets the reason of a refusal.
function Broker:_call(server, body, sig, deadline, rec)
  local tool, args = accepted_call(server, body)                       -- 10
  if not tool then
    rec.reason = "payload"
    return 403, M.MCP_REFUSED
  end
  local token, why = self:_token(server, sig)                          -- 11
  if token == nil then
    rec.reason = why
    return 502
  end
  local filter
  if token ~= "" then
    filter = core.reflect_filter(token)
    if filter == nil then return 502 end
  end
  local headers = { "content-type: application/json", "accept: application/json, text/event-stream" }
  if token ~= "" then headers[#headers + 1] = "authorization: Bearer " .. token end
  local encoded = json.encode(json.object({ "jsonrpc", "id", "method", "params" }, {
    jsonrpc = "2.0", id = 1, method = "tools/call",
    params = json.object({ "name", "arguments" }, { name = tool, arguments = args }),
  }))
  if not encoded then return 502 end
  local res, refusal, reason = self:_post(server, headers, encoded, sig, deadline, rec)   -- 12, 13
  if not res then
    rec.reason = reason
    return 502, refusal
  end
  local function refuse(r, text)
    rec.reason = r
    return 502, text
  end
  if filter and filter:hit(res.body) then return refuse("reflection", M.REFLECTED) end   -- 14
  local msg = message.extract(res.body, res.content_type)             -- 15
  if msg == nil then return refuse("upstream_invalid", M.NO_MESSAGE) end
  if filter and message.reflects(filter, msg) then return refuse("reflection", M.REFLECTED) end  -- 16
  local out = json.encode(msg, broker.MAX_REPLY_BYTES)                 -- 17
  if out == nil then return 502 end
  return 200, out
end

-- Binds the socket (mode 0600) and starts serving. opts: maxCalls, signal
-- (the run signal: from its abort on, every route answers 410 and calls in
-- progress are cut), scope (what token hooks see), allowHttp, fetchImpl,
-- recorder (the runner's, sandbox/ops/record.lua) and run (the run's record,
-- whose counters the calls move; its turn is the run id).
function M.start(path, servers, opts)
  local run = opts.run
  local self = setmetatable({
    turn_signal = opts.signal, scope = opts.scope or {}, allowHttp = opts.allowHttp == true,
    fetchImpl = opts.fetchImpl, recorder = opts.recorder, turn = run,
    channel = run and run.channel, turn_id = run and run.turn,
  }, Broker)
  -- The routes as data, as the sealed broker hands them to the listener:
  -- {path, kind, handle}; C matches the path and names the index.
  local routes, paths = {}, {}
  for i, s in ipairs(servers) do
    local set = {}
    for _, t in ipairs(s.tools) do set[t] = true end
    local server = { name = s.name, url = s.url, token = s.token, tool_set = set }
    routes[i] = { path = "/mcp/" .. s.name, kind = "mcp",
                  handle = function(b, body, sig, deadline, rec) return b:_call(server, body, sig, deadline, rec) end }
    paths[i] = routes[i].path
  end
  self.route_list = routes
  local listener, err = core.broker_listen {
    path = path, routes = paths, max_calls = opts.maxCalls, policy = "precheck",
    max_body = M.MAX_BODY,
    on_call = function(call, i, n) broker.dispatch(self, call, routes[i], n) end,
    on_refused = function(r) broker.refused(self, r) end,
  }
  if not listener then return nil, err end
  self.listener = listener
  self.unhook = opts.signal:on_abort(function() listener:end_turn() end)
  return self
end

function Broker:stats()
  return self.listener:stats()
end

-- Forced stop: every connection destroyed (their call signals abort, so an
-- upstream call in progress is cancelled), the socket closed and unlinked.
function Broker:stop()
  if self.unhook then self.unhook() self.unhook = nil end
  self.listener:stop()
end

return M
