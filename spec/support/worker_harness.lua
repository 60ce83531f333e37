-- worker_harness.lua: runs the sealed worker's Lua (worker/lua/) on the host
-- against the loadable primitive module build/worker/sbxw.so, through the
-- turn entry's seams (spec/worker.md 1.1): a private workspace directory, a
-- broker function and a clock.
--
--   local W = require "worker_harness"
--   if not W.available() then ... pending ... end
--   local worker = W.worker()
--   local reply, status, err = worker.run_turn(W.turn{text = "hi"}, {workspace = dir, broker = fn})
--
-- Broker functions: W.scripted(script) answers from Lua (a log of every
-- request); W.socket_broker(path) sends the worker's exact request over the
-- real Unix socket with core.unix_request inside an async task, so the
-- broker's loop keeps turning while the worker waits (the worker's loop
-- runs inside that task's coroutine and yields with it).
package.path = "worker/lua/?.lua;" .. package.path
package.cpath = "build/worker/?.so;" .. package.cpath

local W = {}

local loaded_ok
-- true when the primitive module can be loaded (build/worker/sbxw.so).
function W.available()
  if loaded_ok == nil then loaded_ok = (pcall(require, "sbxw")) end
  return loaded_ok
end

function W.sbxw() return require "sbxw" end
function W.codec() return require "codec" end
function W.worker() return require "worker" end

---------------------------------------------------------------- files

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return (out:gsub("%s+$", ""))
end
W.sh = sh

function W.tmpdir()
  local dir = sh("mktemp -d /tmp/sbx-worker-spec-XXXXXX")
  assert(dir:match("^/tmp/sbx%-worker%-spec%-"), "mktemp failed")
  return dir
end

function W.rmdir(dir)
  assert(dir:match("^/tmp/sbx%-worker%-spec%-"))
  os.execute("rm -rf '" .. dir .. "'")
end

function W.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local data = f:read("a")
  f:close()
  return data
end

function W.write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

-- Every file under dir (relative names, sorted).
function W.files(dir)
  local out = {}
  for name in sh("cd '" .. dir .. "' && find . -mindepth 1 | sort"):gmatch("[^\n]+") do
    out[#out + 1] = name:sub(3)
  end
  return out
end

---------------------------------------------------------------- JSON

-- Encodes a Lua description: W.arr{...} arrays, W.obj(names, values)
-- ordered objects, plain tables with string keys as objects (sorted keys).
function W.arr(list) return W.codec().array(list or {}) end
function W.obj(names, values) return W.codec().object(names, values) end
function W.encode(v) return W.codec().encode(v) end
function W.decode(s) return assert(W.codec().decode(s)) end
function W.null() return W.codec().null end

function W.tool_spec(name, description, parameters)
  return W.obj({ "name", "description", "parameters" }, {
    name = name, description = description or ("The " .. name .. " tool."),
    parameters = parameters or W.obj({ "type" }, { type = "object" }),
  })
end

W.SPEAKER = { id = "alice", name = "Alice" }

-- Turn fields; `over` replaces members (W.NONE removes one).
W.NONE = {}
function W.turn_fields(over)
  local t = {
    text = "hello", speaker = W.obj({ "id", "name" }, W.SPEAKER), model = "test-model",
    prompt = "You are a helpful assistant.", timeZone = "UTC", reset = false,
    tools = W.arr(), mcp = W.arr(),
  }
  for k, v in pairs(over or {}) do
    if v == W.NONE then t[k] = nil else t[k] = v end
  end
  if type(t.speaker) == "table" and getmetatable(t.speaker) == nil then
    t.speaker = W.obj({ "id", "name" }, t.speaker)
  end
  return t
end

function W.turn(over)
  return W.encode(W.obj({ "text", "speaker", "model", "prompt", "timeZone", "reset", "tools", "mcp" },
    W.turn_fields(over)))
end

-- A Chat Completions response with a final text (content may be W.null()).
function W.chat(content)
  return W.encode(W.obj({ "choices" }, { choices = W.arr { W.obj({ "index", "message" }, {
    index = 0, message = W.obj({ "role", "content" }, { role = "assistant", content = content }) }) } }))
end

-- A response with tool calls: each {id=, name=, arguments= (string or any
-- JSON value), type=, raw = a whole replacement value}.
function W.calls(list, content)
  local calls = W.arr()
  for i, c in ipairs(list) do
    if c.raw ~= nil then
      calls[i] = c.raw
    else
      calls[i] = W.obj({ "id", "type", "function" }, {
        id = c.id, type = c.type,
        ["function"] = W.obj({ "name", "arguments" }, { name = c.name, arguments = c.arguments }),
      })
    end
  end
  return W.encode(W.obj({ "choices" }, { choices = W.arr { W.obj({ "index", "message" }, {
    index = 0, message = W.obj({ "role", "content", "tool_calls" },
      { role = "assistant", content = content or W.null(), tool_calls = calls }) }) } }))
end

---------------------------------------------------------------- brokers

-- W.scripted{model = {bytes or {status, bytes}...}, tools = {name = fn(body) -> status, bytes},
-- mcp = {server = fn(body) -> status, bytes}} -> broker function, log.
-- log[i] = {route, body (bytes), json (decoded)}. An exhausted model queue
-- answers W.chat("done").
function W.scripted(script)
  local client = require "broker_client"
  local log = {}
  local model_i = 0
  local function answer(route, body)
    if route == "/model" then
      model_i = model_i + 1
      local item = (script.model or {})[model_i]
      if item == nil then return 200, W.chat("done") end
      if type(item) == "function" then return item(body, log) end
      if type(item) == "table" then return item[1], item[2] end
      return 200, item
    end
    local name = route:match("^/tools/(.+)$")
    if name and script.tools and script.tools[name] then return script.tools[name](body) end
    local server = route:match("^/mcp/(.+)$")
    if server and script.mcp and script.mcp[server] then return script.mcp[server](body) end
    return 404, '{"error":"not found"}'
  end
  local function broker(route, body)
    log[#log + 1] = { route = route, body = body, json = W.codec().decode(body) }
    return client.interpret(answer(route, body))
  end
  return broker, log
end

-- The model request bodies of a log, decoded.
function W.model_requests(log)
  local out = {}
  for _, e in ipairs(log) do
    if e.route == "/model" then out[#out + 1] = e.json end
  end
  return out
end

function W.routes(log)
  local out = {}
  for _, e in ipairs(log) do out[#out + 1] = e.route end
  return out
end

-- The exact request the worker's client writes (spec/worker.md 4.1).
function W.raw_request(route, body)
  return "POST " .. route .. " HTTP/1.1\r\nhost: broker\r\ncontent-type: application/json\r\n"
    .. "content-length: " .. #body .. "\r\nauthorization: Bearer sandbox-dummy-key\r\n\r\n" .. body
end

-- A broker function over the real socket at `path` (inside an async task).
-- statuses collects every HTTP status seen.
function W.socket_broker(path, statuses, bodies)
  local async = require "sandbox.async"
  local core = require "sandbox.core"
  local client = require "broker_client"
  return function(route, body)
    if bodies then bodies[#bodies + 1] = { route = route, body = body } end
    local res = async.await(function(resume)
      core.unix_request(path, W.raw_request(route, body), { timeout_ms = 65000 }, resume)
    end)
    if not res.ok then return client.interpret(nil, "transport") end
    local code, rest = res.data:match("^HTTP/1%.[01] (%d%d%d)[^\r\n]*\r\n(.*)$")
    if not code then return client.interpret(502, "") end
    local payload = rest:match("^.-\r\n\r\n(.*)$") or ""
    if statuses then statuses[#statuses + 1] = tonumber(code) end
    return client.interpret(tonumber(code), payload)
  end
end

return W
