-- precheck_harness.lua: what the precheck runner's specs share
-- (shared/spec/precheck.md 9): the real MCP servers on the official SDK (one
-- answering JSON, one answering one SSE event), a precheck broker on a real
-- Unix socket, a recording fake driver (the runner's `driver` seam), a run
-- context, and the real bun running the entry script outside a container.
local async = require "sandbox.async"
local core = require "sandbox.core"
local H = require "broker_harness"
local json = require "sandbox.json"
local signals = require "sandbox.signal"
local spec_fs = require "spec_fs"

local P = {}

P.TOKEN = "sk-live-123"
P.ENTRY = "worker/precheck/precheck-main.mjs"
P.ENTRY_DIR = "worker/precheck"
P.raw, P.send, P.parse = H.raw, H.send, H.parse

-- POST /mcp/<server> with a tools/call of tool (args as a JSON text).
function P.call_body(tool, args)
  return '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"' .. tool
    .. '","arguments":' .. (args or "{}") .. '}}'
end

function P.post(path, route, body, headers)
  return H.send(path, H.raw(route, body, headers))
end

function P.call(path, server, tool, args)
  return P.post(path, "/mcp/" .. server, P.call_body(tool, args))
end

-- A private short directory for sockets and run roots; P.rmdir removes it.
function P.tmpdir() return spec_fs.tmpdir("sbx-pc", nil, spec_fs.short_tmp()) end
function P.rmdir(dir) spec_fs.rmdir(dir) end

-- A spec file's run roots and its MCP server on the official SDK:
--   local F = P.fixture()        -- F.root() -> a fresh runRoot path (not created);
--                                -- F.keep(dir) removes dir at teardown too
--   setup(F.setup) teardown(F.teardown); F.server is the started server (or nil
--   when the SDK fixtures are missing: F.ok, F.why from mcp_server.available()).
function P.fixture()
  local mcp = require "mcp_server"
  local F, roots = {}, {}
  F.ok, F.why = mcp.available()
  function F.root()
    local base = P.tmpdir()
    roots[#roots + 1] = base
    return base .. "/run"
  end
  function F.keep(dir) roots[#roots + 1] = dir end   -- removed at teardown
  function F.setup()
    if F.ok then F.server = mcp.start {} end
  end
  function F.teardown()
    if F.server then F.server:stop() end
    for _, d in ipairs(roots) do P.rmdir(d) end
  end
  return F
end

-- Starts a precheck broker on a fresh socket for `servers` (the run's
-- filtered grant). opts as lua/sandbox/precheck/_broker.lua's, with signal
-- defaulting to a fresh one. Returns broker, socket path, dir, signal.
function P.broker(servers, opts)
  local pb = require "sandbox.precheck._broker"
  opts = opts or {}
  local dir = P.tmpdir()
  local path = dir .. "/broker.sock"
  local sig = opts.signal or signals.new()
  local b = assert(pb.start(path, servers, {
    maxCalls = opts.maxCalls or 16, signal = sig, scope = opts.scope or { channel = "c", target = "t", tier = "member" },
    allowHttp = true, fetchImpl = opts.fetchImpl,
  }))
  return b, path, dir, sig
end

function P.stop(b, dir)
  b:stop()
  async.sleep(0)
  P.rmdir(dir)
end

-- A server of a grant, with the host token.
function P.server(name, url, tools, token)
  return { name = name, url = url, tools = tools, token = token ~= false and function() return token or P.TOKEN end or nil }
end

-- The context the core hands to run(): schedule #13 created by an owner,
-- run for a member, firing 2026-10-04 in Europe/Paris.
function P.context(over)
  local c = {
    schedule = { id = 13, title = "Morning HRV", channel = "discord:guild:1", target = "dm:alice",
                 createdTier = "owner" },
    firedAt = "2026-10-04T05:00:00.000Z",
    tier = "member",
    timeZone = "Europe/Paris",
    today = "2026-10-04",
    tools = {},
  }
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

-- A recording fake of the runner's driver seam: driver.exec(spec, input,
-- signal, o) calls behaviour(spec, input, signal, o, call) for stdout. Each
-- call keeps spec, input, o, signal and what the behaviour recorded on `call`.
function P.driver(behaviour)
  local d = { calls = {} }
  function d.exec(spec, input, sig, o)
    local call = { spec = spec, input = input, o = o, signal = sig }
    d.calls[#d.calls + 1] = call
    return behaviour(spec, input, sig, o, call)
  end
  return d
end

-- Behaviour: answer `stdout` as the worker would.
function P.answer(stdout)
  return function() return stdout end
end

-- The broker of a fake run, reached the way the container reaches it.
function P.run_post(spec, route, body, headers)
  return P.post(spec.runDir .. "/broker.sock", route, body, headers)
end

-- Runner options: grant `servers` (a list, or a function of the scope).
function P.options(root, grant, over)
  local o = {
    image = "pi-roundtable-sandbox:precheck", runRoot = root, allowHttpMcp = true,
    grant = type(grant) == "function" and grant or function() return grant or {} end,
  }
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

-- The entries left in a directory.
function P.entries(dir)
  return core.fs_readdir(dir) or {}
end

-- Runs the entry script with the real bun outside a container: env holds
-- only HOME, TMPDIR, PRECHECK_BROKER_SOCKET and PATH. Yields while bun runs.
-- Returns the decoded answer, the raw stdout, the exit status and the
-- signal that ended it (kill_after_ms: SIGKILL it then, as the runner's
-- deadline would).
function P.entry(input, socket, tmp, kill_after_ms)
  local env = {
    "HOME=" .. tmp, "TMPDIR=" .. tmp, "PATH=" .. (os.getenv("PATH") or "/usr/bin:/bin"),
  }
  if socket then env[#env + 1] = "PRECHECK_BROKER_SOCKET=" .. socket end
  local timer
  local res = async.await(function(resume)
    local proc = core.spawn {
      -- cwd = the entry script's folder, as /app in the image (bunfig.toml)
      file = "env", args = { "-C", P.ENTRY_DIR, "bun", P.ENTRY:match("[^/]+$") }, env = env,
      stdin = type(input) == "string" and input or assert(json.encode(input)),
      max_stdout = 1048576, max_stderr = 1048576, on_exit = resume,
    }
    if kill_after_ms then timer = core.timer(kill_after_ms, function() proc:kill(core.SIGKILL) end) end
  end)
  if timer then timer:stop() end
  assert(not res.error, res.error)
  return json.decode(res.stdout), res.stdout, res.exit_status, res.term_signal
end

-- The worker input of the entry script for `script`.
function P.input(script, servers, over)
  local list = json.array {}
  for i, s in ipairs(servers or {}) do
    list[i] = json.object({ "name", "tools" }, { name = s[1], tools = json.array(s[2]) })
  end
  local v = {
    script = script, firedAt = "2026-10-04T05:00:00.000Z", timeZone = "Europe/Paris",
    today = "2026-10-04", schedule = json.object({ "id", "title" }, { id = 13, title = "Morning HRV" }),
    servers = list,
  }
  for k, x in pairs(over or {}) do v[k] = x end
  return json.object({ "script", "firedAt", "timeZone", "today", "schedule", "servers" }, v)
end

-- The requests the fixture got on /mcp and /raw (inside a task).
function P.log(server)
  return assert(server:log())
end

return P
