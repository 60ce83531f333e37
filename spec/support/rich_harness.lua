-- rich_harness.lua: a rich broker (sandbox.rich.broker) on a real socket in
-- a private temp dir, for the broker specs, with its upstreams real loopback
-- servers: the Anthropic-shaped SSE fixture (reached through fetchImpl,
-- which maps https://api.anthropic.com onto it and then uses the built-in
-- libcurl transport) and, when asked, an MCP server on the official SDK.
--
--   local h = harness.new{ over = {...broker options}, seams = {...}, mcp = {stateful=, require_key=} }
--   h.b, h.sock, h.up, h.mcp, h.logs (captured logger lines), h.fetched (what fetchImpl saw)
--   h:bind{channel=, speaker=, thinking=, turnId=} -> release, signal
--   h:post(target, body, headers) / h:get(target)  -> {status, headers, body}
--   h:stop()
local async = require "sandbox.async"
local json = require "sandbox.json"
local peer = require "rich_peer"
local rich = require "sandbox.rich"
local signal = require "sandbox.signal"
local spec_fs = require "spec_fs"

local M = {}

M.SECRET = "sk-ant-oat01-Host/Secret+Value=42"
M.MCP_KEY = "mcp-host-key-7"
M.MODEL = "claude-sonnet-4-6"

local H = {}
H.__index = H

function M.logger(lines)
  local function at(level) return function(msg, fields) lines[#lines + 1] = { level = level, msg = msg, fields = fields } end end
  return { info = at("info"), warn = at("warn"), error = at("error") }
end

-- fetchImpl: the broker's request as it was meant, onto the fixture.
function M.forward(up, seen)
  local curl = rich.transport()
  return function(req)
    seen[#seen + 1] = { url = req.url, headers = req.headers, body = req.body }
    local url = req.url:gsub("^https://api%.anthropic%.com", up.url)
    return curl { method = req.method, url = url, headers = req.headers, body = req.body, signal = req.signal }
  end
end

function M.new(o)
  o = o or {}
  local self = setmetatable({ logs = {}, fetched = {}, dirs = {} }, H)
  self.dir = spec_fs.tmpdir("rb", self.dirs, spec_fs.short_tmp())
  self.sock = self.dir .. "/broker.sock"
  self.up = o.up
  local opts = {
    model = M.MODEL, oauthToken = function() return M.SECRET end,
    logger = M.logger(self.logs), allowHttpMcp = true,
  }
  if self.up then opts.fetchImpl = M.forward(self.up, self.fetched) end
  if o.mcp then
    opts.mcp = { servers = { { name = "docs", url = o.mcp.url, tools = { "search" } } },
      token = function() return M.MCP_KEY end }
  end
  for k, v in pairs(o.over or {}) do opts[k] = v end
  self.b = rich.broker(opts, o.seams)
  assert(self.b:listen(self.sock))
  return self
end

function H:bind(t)
  t = t or {}
  local sig = t.signal or signal.new()
  local release = self.b:bind {
    channel = t.channel or "discord:party", profile = t.profile or "main",
    speaker = t.speaker or { id = "123", name = "Ann", principalId = "ann" },
    thinking = t.thinking or "high", signal = sig, deadline = t.deadline, turnId = t.turnId,
  }
  return release, sig
end

function H:post(target, body, headers)
  if type(body) == "table" then body = json.encode(json.jsonable(body)) end
  return peer.request(self.sock, "POST", target, body or "{}", headers)
end

function H:get(target, headers)
  return peer.request(self.sock, "GET", target, nil, headers)
end

function H:model(body, headers, target)
  return self:post(target or "/anthropic/v1/messages", body or { messages = { { role = "user", content = "hi" } } }, headers)
end

function H:warns(msg)
  local out = {}
  for _, l in ipairs(self.logs) do if l.msg == msg then out[#out + 1] = l.fields end end
  return out
end

function H:stop()
  self.b:stop()
  spec_fs.rmdirs(self.dirs)
end

-- Waits (inside a task) until pred() holds, at most `ms` (default 5000).
function M.eventually(pred, ms)
  local waited = 0
  while not pred() do
    if waited >= (ms or 5000) then error("condition not reached", 2) end
    async.sleep(10)
    waited = waited + 10
  end
end

return M
