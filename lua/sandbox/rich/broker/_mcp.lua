-- rich/broker/_mcp.lua: POST /mcp/<server> and GET /mcp-tools (spec/rich-mode.md
-- 13.1, 13.2). Only initialize, notifications/initialized, ping, tools/list
-- and a tools/call of a tool the server's allow-list names (with object
-- arguments, and never in the startup scope) are forwarded; anything else is
-- 403 MCP method refused. The forwarded body is rebuilt ({jsonrpc, method,
-- id?, params?}), the MCP credential is read on every call, and the answer
-- streams back under the model route's response rules (_forward.lua).
local audit = require "sandbox.rich.broker._audit"
local errors = require "sandbox.errors"
local forward = require "sandbox.rich.broker._forward"
local json = require "sandbox.json"
local log = require "sandbox.rich._log"
local model = require "sandbox.rich.broker._model"

local M = {}

M.REFUSED = "MCP method refused"
M.METADATA = { initialize = true, ["notifications/initialized"] = true, ping = true, ["tools/list"] = true }
M.MAX_SESSION_HEADER = 256
M.COPY = { "mcp-session-id", "mcp-protocol-version" }

-- The body's shape (issue 21): what is judged and forwarded (13.1); any
-- other member, jsonrpc included (it is forced), is dropped unread.
M.SHAPE = { unknown = "drop", members = { id = true, method = true, params = true } }

function M.allowed(body, server, startup)
  local m = body.method
  if type(m) ~= "string" then return false end
  if M.METADATA[m] then return true end
  if m ~= "tools/call" or startup then return false end
  local p = body.params
  return json.kind(p) == "object" and type(p.name) == "string" and server.tool_set[p.name] == true
    and json.kind(p.arguments) == "object"
end

function M.handle(b, conn, call)
  local s, server = call.scope, call.server
  local body = call.body
  if not M.allowed(body, server, s.kind == "startup") then
    audit.why(call, "payload")
    return conn:reply(403, M.REFUSED)
  end
  local forwarded = json.encode(json.object({ "jsonrpc", "id", "method", "params" }, {
    jsonrpc = "2.0", id = body.id, method = body.method, params = body.params,
  }))
  local headers, token = {
    ["content-type"] = "application/json", accept = "application/json, text/event-stream",
    ["accept-encoding"] = "identity",
  }, nil
  if b.mcpToken then
    local why
    token, why = model.token(b.mcpToken, s, call.signal)
    if not token then
      audit.why(call, why or audit.aborted(call))
      log.upstream_failure(b.log, { channel = s.channel, turn = s.turnId, upstream = "mcp:" .. server.name,
        latencyMs = b.clock.now() - call.started, error = errors.RICH_CREDENTIAL })
      return conn:reply(502, forward.FAILED)
    end
    headers.authorization = "Bearer " .. token
  end
  for _, name in ipairs(M.COPY) do
    local v = conn.headers[name]
    if type(v) == "string" and #v <= M.MAX_SESSION_HEADER and not v:find("[%c]") then headers[name] = v end
  end
  if not forwarded then
    audit.why(call, "payload")
    return conn:reply(502, forward.FAILED)
  end
  return forward.run(b, conn, {
    scope = s, label = "mcp:" .. server.name, url = server.url, headers = headers, body = forwarded,
    token = token or "", signal = call.signal, started = call.started, mcp = true, call = call,
  })
end

-- 13.2: the servers and tool names of this broker; no credential, no budget.
function M.discovery(b, conn)
  local list = json.array()
  for i, s in ipairs(b.servers) do
    local tools = json.array()
    for j, t in ipairs(s.tools) do tools[j] = t end
    list[i] = json.object({ "name", "tools" }, { name = s.name, tools = tools })
  end
  b:_rearm()
  return conn:reply(200, json.encode(json.object({ "servers" }, { servers = list })), "application/json")
end

return M
