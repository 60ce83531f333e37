-- broker_harness.lua: what the broker specs share: private temp dirs, a raw
-- HTTP client over the real Unix socket, and brokers built on the shared
-- fixture of spec/broker.md ("Behaviours the specs must cover").
local async = require "sandbox.async"
local core = require "sandbox.core"
local sandbox = require "sandbox"
local spec_fs = require "spec_fs"
local unix_request = require "unix_request"

local H = {}

H.DUMMY = "Bearer sandbox-dummy-key"
H.KEY = "real-model-key"
H.MCP_KEY = "real-mcp-key"

H.sh = spec_fs.sh

-- A fresh 0700 directory; removed by H.rmdir.
function H.tmpdir() return spec_fs.tmpdir("sbx-spec") end

function H.rmdir(dir) spec_fs.rmdir(dir, "sbx-spec") end

-- Builds raw request bytes. headers: array of {name, value}; nil uses the
-- worker's standard set. Content-Length is added unless opts.no_length.
function H.raw(route, body, headers, opts)
  opts = opts or {}
  body = body or ""
  headers = headers or {
    { "Host", "broker" }, { "Content-Type", "application/json" }, { "Authorization", H.DUMMY },
  }
  local lines = { (opts.method or "POST") .. " " .. route .. " " .. (opts.version or "HTTP/1.1") }
  for _, h in ipairs(headers) do lines[#lines + 1] = h[1] .. ": " .. h[2] end
  if not opts.no_length then lines[#lines + 1] = "Content-Length: " .. #body end
  return table.concat(lines, "\r\n") .. "\r\n\r\n" .. body
end

-- Parses a reply: {status=, reason=, headers={{name,value}...}, body=} or
-- {closed=true} when the broker closed without writing.
function H.parse(data)
  if data == "" then return { closed = true, raw = "" } end
  local head, body = data:match("^(.-)\r\n\r\n(.*)$")
  assert(head, "reply without a complete head: " .. data:sub(1, 200))
  local status_line, rest = head:match("^([^\r\n]*)\r?\n?(.*)$")
  local code, reason = status_line:match("^HTTP/1%.1 (%d%d%d) (.*)$")
  local headers = {}
  for line in rest:gmatch("[^\r\n]+") do
    local n, v = line:match("^([^:]+): (.*)$")
    headers[#headers + 1] = { n, v }
  end
  return { status = tonumber(code), reason = reason, headers = headers, body = body, raw = data }
end

-- Sends raw bytes over the socket and waits for the whole reply (in a task).
function H.send(path, bytes, opts)
  local res = async.await(function(resume)
    unix_request(path, bytes, opts or { timeout_ms = 70000 }, resume)
  end)
  assert(res.ok, "unix_request failed: " .. tostring(res.error))
  return H.parse(res.data)
end

-- POST route with a JSON body string (default {"messages":[]}).
function H.post(path, route, body, headers)
  return H.send(path, H.raw(route, body or '{"messages":[]}', headers))
end

H.SPEAKER = { id = "guest-a", name = "Guest", principalId = "p-guest-a" }

-- Broker options for the shared fixture against the fake upstream `fake`.
function H.options(fake, over)
  local o = {
    model = "test-model",
    modelUrl = fake:url("/v1/chat/completions"),
    allowHttp = true,
    apiKey = function() return H.KEY end,
    channel = "fake:guests",
    speaker = { id = H.SPEAKER.id, name = H.SPEAKER.name, principalId = H.SPEAKER.principalId },
  }
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

-- Starts a broker in a fresh dir; returns broker, socket path, dir.
function H.start(opts)
  local dir = H.tmpdir()
  local b = sandbox.broker(opts)
  local path = dir .. "/broker.sock"
  assert(b:start(path))
  return b, path, dir
end

function H.finish(b, dir)
  b:end_turn()
  b:stop()
  -- Let the loop turn once so close callbacks run. Inside a task the loop is
  -- already running and core.run refuses to re-enter it: yield to it instead.
  local _, is_main = coroutine.running()
  if is_main then core.run("nowait") else async.sleep(0) end
  H.rmdir(dir)
end

function H.header(reply_or_req, name)
  name = name:lower()
  for _, h in ipairs(reply_or_req.headers or {}) do
    if h[1]:lower() == name then return h[2] end
  end
  return nil
end

return H
