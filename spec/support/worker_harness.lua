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
-- real Unix socket with unix_request.lua inside an async task, so the
-- broker's loop keeps turning while the worker waits (the worker's loop
-- runs inside that task's coroutine and yields with it).
-- The sanitizer run (scripts/check.sh) puts build-asan/ on the cpath.
local B = package.cpath:match("(build%-asan)/") or "build"
package.path = "worker/lua/?.lua;" .. package.path
-- appended, not prepended: specs that start child interpreters take the
-- first build*/?.so of package.cpath as sandbox.core's (hardening_spec, log_spec)
package.cpath = package.cpath .. ";" .. B .. "/worker/?.so"
local spec_fs = require "spec_fs"

local W = {}

W.BUILD = B

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

local sh = spec_fs.sh
W.sh, W.read, W.write = spec_fs.sh, spec_fs.read, spec_fs.write

function W.tmpdir() return spec_fs.tmpdir("sbx-worker-spec") end

function W.rmdir(dir) spec_fs.rmdir(dir, "sbx-worker-spec") end

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
  local names = { "text", "speaker", "model", "prompt", "timeZone", "reset", "tools", "mcp" }
  local known = {}
  for _, n in ipairs(names) do known[n] = true end
  local extra = {}
  for k in pairs(over or {}) do
    if not known[k] then extra[#extra + 1] = k end
  end
  table.sort(extra)
  for _, k in ipairs(extra) do names[#names + 1] = k end
  return W.encode(W.obj(names, W.turn_fields(over)))
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
  local unix_request = require "unix_request"
  local client = require "broker_client"
  return function(route, body)
    if bodies then bodies[#bodies + 1] = { route = route, body = body } end
    local res = async.await(function(resume)
      unix_request(path, W.raw_request(route, body), { timeout_ms = 65000 }, resume)
    end)
    if not res.ok then return client.interpret(nil, "transport") end
    local code, rest = res.data:match("^HTTP/1%.[01] (%d%d%d)[^\r\n]*\r\n(.*)$")
    if not code then return client.interpret(502, "") end
    local payload = rest:match("^.-\r\n\r\n(.*)$") or ""
    if statuses then statuses[#statuses + 1] = tonumber(code) end
    return client.interpret(tonumber(code), payload)
  end
end

-- A container driver (spec/runtime.md 4.1) that is the worker process's
-- contract without the container: the turn's bytes in, the worker Lua over
-- the turn's real broker socket, the reply read back from the stdout bytes
-- it would print (drivers/contract.lua), its reason when it fails. For the
-- runtime specs that need a real worker but no Docker. mutate(broker) ->
-- broker may wrap the broker function; edit(bytes) -> bytes the turn.
function W.driver(mutate, edit)
  local contract = require "sandbox.drivers.contract"
  local container = require "sandbox.drivers._sealed"
  local errors = require "sandbox.errors"
  return {
    run = function(_, spec, turn, _, report)
      local broker = W.socket_broker(spec.runDir .. "/broker.sock")
      if mutate then broker = mutate(broker) end
      local bytes = type(turn) == "string" and turn or container.turn_json(turn)
      if edit then bytes = edit(bytes) end
      local worker = W.worker()
      local reply, code = worker.run_turn(bytes, { workspace = spec.workspaceDir, broker = broker })
      local out = worker.encode_reply(reply)
      report = report or {}
      report.exit = code
      if code ~= 0 then
        report.worker_reason = contract.worker_reason(out)
        error(errors.WORKER, 0)
      end
      return contract.parse_reply(out)
    end,
  }
end

---------------------------------------------------------------- processes

local CWD = sh("pwd")

-- Runs worker.main() in a child Lua process with stdin_bytes on stdin.
-- opts.workspace (required), opts.socket (sbxw.set_socket target).
-- -> stdout bytes, stderr bytes, exit status.
function W.run_main(stdin_bytes, opts)
  local dir = W.tmpdir()
  W.write(dir .. "/stdin", stdin_bytes)
  W.write(dir .. "/main.lua", string.format([[
package.path = %q .. package.path
package.cpath = %q .. package.cpath
local sbxw = require "sbxw"
%s
local worker = require "worker"
worker.defaults.workspace = %q
local emit, status = sbxw.emit, 99
sbxw.emit = function(bytes, code) status = code; return emit(bytes, code) end
worker.main()
os.exit(status)
]], CWD .. "/worker/lua/?.lua;", CWD .. "/" .. B .. "/worker/?.so;",
    opts.socket and string.format("sbxw.set_socket(%q)", opts.socket) or "", opts.workspace))
  local rc = sh(string.format("cd '%s' && lua5.4 main.lua < stdin > stdout 2> stderr; echo $?", dir))
  local out, err = W.read(dir .. "/stdout"), W.read(dir .. "/stderr")
  W.rmdir(dir)
  return out, err, tonumber(rc)
end

local FAKE_SOCKET = [[
import socket, sys, os
path, resp_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(8)
print(os.getpid(), flush=True)
for i in range(n):
    c, _ = srv.accept()
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(65536)
        if not chunk: break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length": length = int(value.strip())
    while len(body) < length:
        chunk = c.recv(65536)
        if not chunk: break
        body += chunk
    with open(os.path.join(resp_dir, "req_%d" % i), "wb") as f: f.write(head + b"\r\n\r\n" + body)
    with open(os.path.join(resp_dir, "resp_%d" % i), "rb") as f: reply = f.read()
    try:
        c.sendall(reply)
    except OSError:
        pass
    c.close()
]]

-- A fake broker process on a Unix socket that answers the raw responses in
-- order (one per connection) and records each raw request.
-- -> {path=, requests=function() -> list of raw requests, stop=function()}
function W.fake_socket(responses)
  local dir = W.tmpdir()
  W.write(dir .. "/fake.py", FAKE_SOCKET)
  for i, r in ipairs(responses) do W.write(dir .. "/resp_" .. (i - 1), r) end
  local path = dir .. "/broker.sock"
  local pipe = assert(io.popen(string.format("exec env -u LD_PRELOAD python3 '%s/fake.py' '%s' '%s' %d",
    dir, path, dir, #responses), "r"))
  local pid = tonumber(pipe:read("l"))
  assert(pid, "fake socket did not start")
  local f = {}
  f.path = path
  function f.requests()
    local out = {}
    for i = 0, #responses - 1 do out[#out + 1] = W.read(dir .. "/req_" .. i) end
    return out
  end
  function f.stop()
    if not pipe then return end
    os.execute("kill " .. pid .. " 2>/dev/null")
    pipe:close()
    pipe = nil
    W.rmdir(dir)
  end
  return f
end

-- A real broker (lua/sandbox) in a child process with host tool `echo`
-- answering "pong"; opts.model_url points /model at a fake upstream;
-- opts.path places the socket (default: in a fresh private dir).
-- -> {path=, stop=function()}
function W.broker_process(opts)
  opts = opts or {}
  local dir = W.tmpdir()
  os.execute("chmod 700 '" .. dir .. "'")
  local path = opts.path or (dir .. "/broker.sock")
  W.write(dir .. "/broker.lua", string.format([[
package.path = %q .. package.path
package.cpath = %q .. package.cpath
local sandbox = require "sandbox"
local core = require "sandbox.core"
local b = sandbox.broker {
  model = "test-model", modelUrl = %q, allowHttp = true,
  apiKey = function() return "real-model-key" end,
  channel = "fake:guests", speaker = { id = "guest-a", name = "Guest", principalId = "p-guest-a" },
  tools = { { name = "echo", description = "d", parameters = { type = "object" },
              run = function() return "pong" end } },
}
assert(b:start(%q))
io.stdout:write(core.getpid(), "\n")
io.stdout:flush()
core.run()
]], CWD .. "/lua/?.lua;" .. CWD .. "/lua/?/init.lua;", CWD .. "/" .. B .. "/lua/?.so;",
    opts.model_url or "http://127.0.0.1:9/v1/chat/completions", path))
  local pipe = assert(io.popen("exec lua5.4 '" .. dir .. "/broker.lua'", "r"))
  local pid = tonumber(pipe:read("l"))
  assert(pid, "broker process did not start")
  return {
    path = path,
    stop = function()
      if not pipe then return end
      os.execute("kill " .. pid .. " 2>/dev/null")
      pipe:close()
      pipe = nil
      W.rmdir(dir)
    end,
  }
end

return W
