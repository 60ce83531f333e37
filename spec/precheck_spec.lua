-- precheck_spec.lua: the precheck script runner (shared/spec/precheck.md
-- 1-4, 6.1; behaviours 11-24 of section 9): options and construction checks,
-- grant checks, describe, toolName, the container arguments, and runs
-- through the `driver` seam (a recording fake that acts as the container:
-- it reads the worker input and calls the run's real broker over its Unix
-- socket), with a real MCP server on the official SDK behind the broker.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local P = require "precheck_harness"
local sandbox = require "sandbox"
local spec_fs = require "spec_fs"

local run = async.run
local server

local ANSWER_OK = '{"ok":true,"result":{"wake":false,"note":"normal"}}'

local function expect_error(msg, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected the error: " .. msg)
  assert.equal(msg, err)
end

local function health_grant()
  return {
    { name = "health", url = server.url, tools = { "garmin-login", "garmin-get-hrv" },
      token = function() return P.TOKEN end },
    { name = "google", url = server.url, tools = { "send" } },
  }
end

local F = P.fixture()
local root = F.root
local ok_mcp, why_mcp = F.ok, F.why
setup(function()
  F.setup()
  server = F.server
end)
teardown(F.teardown)

describe("precheck runner: construction (precheck.md 2.1)", function()
  local driver = P.driver(P.answer(ANSWER_OK))
  local function make(over)
    return sandbox.precheckScriptRunner(P.options(root(), {}, over))
  end

  it("refuses maxCalls 0 or 101 (behaviour 23)", function()
    expect_error("invalid precheck MCP call budget", function() make { driver = driver, maxCalls = 0 } end)
    expect_error("invalid precheck MCP call budget", function() make { driver = driver, maxCalls = 101 } end)
    expect_error("invalid precheck MCP call budget", function() make { driver = driver, maxCalls = 2.5 } end)
    make { driver = driver, maxCalls = 100 }
  end)

  it("checks timeoutMs, grant and toolName in order", function()
    expect_error("precheck timeoutMs must be 1000 to 600000", function() make { driver = driver, timeoutMs = 999 } end)
    expect_error("precheck timeoutMs must be 1000 to 600000", function() make { driver = driver, timeoutMs = 600001, grant = 1 } end)
    expect_error("precheck grant must be a function", function() make { driver = driver, grant = {} } end)
    expect_error("precheck toolName must be a function", function() make { driver = driver, toolName = "x" } end)
    expect_error("invalid precheck MCP call budget", function() make { driver = driver, maxCalls = 0, timeoutMs = 1 } end)
  end)

  it("refuses root uid/gid and ids other than the process's (behaviour 23)", function()
    local uid, gid = core.getuid()
    local msg = "run the host as a non-root user; worker uid/gid must match it"
    expect_error(msg, function() make { driver = driver, uid = 0 } end)
    expect_error(msg, function() make { driver = driver, gid = 0 } end)
    expect_error(msg, function() make { driver = driver, uid = uid + 1 } end)
    if uid ~= 0 then make { driver = driver, uid = uid, gid = gid } end
  end)

  it("refuses a relative or public runRoot, and one too long for the socket (behaviour 23)", function()
    expect_error("sandbox roots must be absolute dedicated directories", function()
      sandbox.precheckScriptRunner(P.options("relative/run", {}, { driver = driver })) end)
    expect_error("sandbox roots must be absolute dedicated directories", function()
      sandbox.precheckScriptRunner(P.options("/", {}, { driver = driver })) end)
    local public = root()
    assert(core.fs_mkdir(public, tonumber("755", 8)))
    os.execute("chmod 755 " .. spec_fs.q(public))
    expect_error("sandbox roots must be private directories owned by the service user", function()
      sandbox.precheckScriptRunner(P.options(public, {}, { driver = driver })) end)
    local base = P.tmpdir()
    F.keep(base)
    local long = base .. "/" .. string.rep("r", 72 - #base - 1)
    assert.equal(72, #long)
    sandbox.precheckScriptRunner(P.options(long, {}, { driver = driver }))
    expect_error("broker socket path too long", function()
      sandbox.precheckScriptRunner(P.options(long .. "x", {}, { driver = driver })) end)
  end)

  it("creates a missing runRoot 0700 and dry-runs the container arguments", function()
    local r = root()
    make { driver = driver, runRoot = r }
    assert.equal("700", spec_fs.mode(r))
    expect_error("invalid container name or image", function() make { driver = driver, image = "-bad" } end)
    expect_error("invalid container name or image", function() make { driver = driver, image = "a b" } end)
    expect_error("invalid entrypoint", function() make { driver = driver, entrypoint = { "/usr/local/bin/bun", "--eval" } } end)
    expect_error("invalid entrypoint", function() make { driver = driver, entrypoint = {} } end)
    expect_error("invalid entrypoint", function() make { driver = driver, entrypoint = { "/x\n" } } end)
    expect_error("invalid resource limits", function() make { driver = driver, limits = { memoryMb = 32 } } end)
    expect_error("invalid resource limits", function() make { driver = driver, limits = { pids = 4 } } end)
    expect_error("invalid resource limits", function() make { driver = driver, limits = { cpus = 0 } } end)
    local comma = P.tmpdir() .. "/a,b"
    F.keep(comma:match("^(.*)/"))
    expect_error("mount paths must be absolute dedicated directories", function()
      sandbox.precheckScriptRunner(P.options(comma, {}, { driver = driver })) end)
  end)

  it("refuses an unknown option by name", function()
    expect_error("unknown precheck option: maxcalls", function() make { driver = driver, maxcalls = 3 } end)
  end)

  it("exposes timeoutMs only when the option is set", function()
    assert.is_nil(make({ driver = driver }).timeoutMs)
    assert.equal(5000, make({ driver = driver, timeoutMs = 5000 }).timeoutMs)
    assert.same({ "/usr/local/bin/bun", "/app/precheck-main.mjs" }, sandbox.PRECHECK_ENTRYPOINT)
  end)
end)

describe("precheck runner: toolName (precheck.md 1)", function()
  it("defaults to the tool's own name and uses the option when given (behaviour 17)", function()
    local d = P.driver(P.answer(ANSWER_OK))
    local plain = sandbox.precheckScriptRunner(P.options(root(), {}, { driver = d }))
    assert.equal("garmin-get-hrv", plain.toolName("health", "garmin-get-hrv"))
    local named = sandbox.precheckScriptRunner(P.options(root(), {}, {
      driver = d, toolName = function(s, t) return s .. "_" .. t end }))
    assert.equal("health_garmin-get-hrv", named.toolName("health", "garmin-get-hrv"))
    assert.equal("health_garmin-get-hrv", named:toolName("health", "garmin-get-hrv"))
  end)

  it("must answer synchronously with a non-empty string", function()
    local d = P.driver(P.answer(ANSWER_OK))
    local yields = sandbox.precheckScriptRunner(P.options(root(), {}, {
      driver = d, toolName = function() coroutine.yield() return "x" end }))
    expect_error("precheck toolName must not yield", function() yields.toolName("s", "t") end)
    local empty = sandbox.precheckScriptRunner(P.options(root(), {}, { driver = d, toolName = function() return "" end }))
    expect_error("precheck toolName must return a non-empty string", function() empty.toolName("s", "t") end)
  end)
end)

describe("precheck runner: grant and describe (precheck.md 2.2, 3)", function()
  if not ok_mcp then pending(why_mcp) return end

  local function describe_with(grant)
    local r = sandbox.precheckScriptRunner(P.options(root(), grant, { driver = P.driver(P.answer(ANSWER_OK)) }))
    return run(function() return r.describe({ channel = "c", target = "t", tier = "member" }) end)
  end

  it("lists each granted server with its tools, contains the today sentence, and says can call no MCP server for an empty grant (behaviour 21)", function()
    local text = describe_with(health_grant)
    assert.truthy(text:find("- health: garmin-login, garmin-get-hrv", 1, true))
    assert.truthy(text:find("- google: send", 1, true))
    assert.truthy(text:find("`today` is the date in the host's time zone", 1, true))
    assert.truthy(text:find("export default async ({ mcp, firedAt, timeZone, today, schedule }) => result", 1, true))
    assert.is_nil(text:find(server.url, 1, true))
    local none = describe_with({})
    assert.truthy(none:find("can call no MCP server", 1, true))
    assert.truthy(none:find("`today` is the date in the host's time zone", 1, true))
  end)

  it("refuses a grant with an http://user:pw@ URL as not credential-free (behaviour 22)", function()
    local bad = { { name = "health", url = "http://user:pw@127.0.0.1:9/mcp", tools = { "x" } } }
    local ok, err = pcall(describe_with, bad)
    assert.is_false(ok)
    assert.equal("precheck MCP endpoints must be credential-free HTTPS", err)
    local r = sandbox.precheckScriptRunner(P.options(root(), bad, { driver = P.driver(P.answer(ANSWER_OK)) }))
    ok, err = pcall(run, function() return r.run("export default () => 1", P.context()) end)
    assert.is_false(ok)
    assert.equal("precheck MCP endpoints must be credential-free HTTPS", err)
  end)

  it("checks every grant result in the table's order", function()
    local cases = {
      { "nope", "invalid precheck MCP grant" },
      { { 1 }, "invalid precheck MCP grant" },
      { { [2] = {} }, "invalid precheck MCP grant" },
      { { { name = "a b", url = "https://x", tools = {} } }, "invalid or repeated precheck MCP server name" },
      { { { name = "a", url = "https://x", tools = {} }, { name = "a", url = "https://y", tools = {} } },
        "invalid or repeated precheck MCP server name" },
      { { { name = "a", url = "/relative", tools = {} } }, "invalid precheck MCP endpoint" },
      { { { name = "a", url = "https://x/#frag", tools = {} } }, "precheck MCP endpoints must be credential-free HTTPS" },
      { { { name = "a", url = "ftp://x/", tools = {} } }, "precheck MCP endpoints must be credential-free HTTPS" },
      { { { name = "a", url = "https://x/", tools = { "ok", "ok" } } }, "invalid precheck MCP tool list" },
      { { { name = "a", url = "https://x/", tools = { "bad tool" } } }, "invalid precheck MCP tool list" },
      { { { name = "a", url = "https://x/", tools = "x" } }, "invalid precheck MCP tool list" },
      { { { name = "a", url = "https://x/", tools = {}, token = "k" } }, "precheck MCP token must be a function" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(describe_with, c[1])
      assert.is_false(ok)
      assert.equal(c[2], err)
    end
    local https = describe_with { { name = "a", url = "https://x.example/mcp?team=1", tools = { "t.1" } } }
    assert.truthy(https:find("- a: t.1", 1, true))
  end)

  it("refuses http endpoints unless allowHttpMcp is set", function()
    local r = sandbox.precheckScriptRunner(P.options(root(), health_grant, {
      driver = P.driver(P.answer(ANSWER_OK)), allowHttpMcp = false }))
    local ok, err = pcall(run, function() return r.describe({}) end)
    assert.is_false(ok)
    assert.equal("precheck MCP endpoints must be credential-free HTTPS", err)
  end)
end)

describe("precheck runner: run (precheck.md 4)", function()
  if not ok_mcp then pending(why_mcp) return end

  it("calls grant with the run's tier (member), not the schedule's creation tier (behaviour 15)", function()
    local scopes = {}
    local r = sandbox.precheckScriptRunner(P.options(root(), function(scope)
      scopes[#scopes + 1] = scope
      return {}
    end, { driver = P.driver(P.answer(ANSWER_OK)) }))
    run(function() r.run("export default () => 1", P.context()) end)
    assert.same({ { channel = "discord:guild:1", target = "dm:alice", tier = "member" } }, scopes)
  end)

  it("routes only approved, granted tools: the worker sees health/garmin-get-hrv alone; garmin-login is 403 and /mcp/google 404 (behaviour 16)", function()
    local seen = {}
    local d = P.driver(function(spec, input)
      seen.input = json.decode(input)
      seen.login = P.run_post(spec, "/mcp/health", P.call_body("garmin-login"))
      seen.google = P.run_post(spec, "/mcp/google", P.call_body("send"))
      seen.hrv = P.run_post(spec, "/mcp/health", P.call_body("garmin-get-hrv", '{"date":"2026-10-04"}'))
      return ANSWER_OK
    end)
    local r = sandbox.precheckScriptRunner(P.options(root(), health_grant, { driver = d }))
    run(function()
      r.run("export default () => 1", P.context {
        tools = { { server = "health", tool = "garmin-get-hrv" }, { server = "other", tool = "x" } } })
    end)
    assert.equal(1, #seen.input.servers)
    assert.equal("health", seen.input.servers[1].name)
    assert.same({ "garmin-get-hrv" }, { table.unpack(seen.input.servers[1].tools) })
    assert.equal(403, seen.login.status)
    assert.equal(404, seen.google.status)
    assert.equal(200, seen.hrv.status)
  end)

  it("runs one script: {wake=false, note=\"normal\"}; exact worker input; the socket exists during the run; read-only workspace; default entrypoint; runRoot empty afterwards (behaviour 18)", function()
    local r_root = root()
    local seen = {}
    local d = P.driver(function(spec, input, sig, o)
      seen.spec, seen.input, seen.o = spec, input, o
      local st = core.fs_stat(spec.runDir .. "/broker.sock")
      seen.socket = st and st.type
      seen.socket_mode = spec_fs.mode(spec.runDir .. "/broker.sock")
      seen.workspace = core.fs_readdir(spec.workspaceDir)
      seen.aborted = sig.aborted
      return ANSWER_OK
    end)
    local r = sandbox.precheckScriptRunner(P.options(r_root, health_grant, { driver = d }))
    local script = "export default async ({ today }) => ({ wake: false, note: 'normal' })"
    local res = run(function()
      return r.run(script, P.context { tools = { { server = "health", tool = "garmin-get-hrv" } } })
    end)
    assert.is_false(res.wake)
    assert.equal("normal", res.note)
    local expected = '{"script":' .. json.encode(script) .. ',"firedAt":"2026-10-04T05:00:00.000Z","timeZone":"Europe/Paris",'
      .. '"today":"2026-10-04","schedule":{"id":13,"title":"Morning HRV"},"servers":[{"name":"health","tools":["garmin-get-hrv"]}]}'
    assert.equal(expected, seen.input)
    assert.is_nil(seen.input:find(server.url, 1, true))
    assert.is_nil(seen.input:find(P.TOKEN, 1, true))
    assert.equal("socket", seen.socket)
    assert.equal("600", seen.socket_mode)
    assert.same({}, seen.workspace)
    assert.is_false(seen.aborted)
    assert.is_true(seen.spec.workspaceReadOnly)
    assert.same({ "/usr/local/bin/bun", "/app/precheck-main.mjs" }, seen.spec.entrypoint)
    assert.equal(65536, seen.o.stdoutBytes)
    assert.truthy(seen.spec.name:find("^roundtable%-precheck%-13%-%x%x%x%x%x%x%x%x$"))
    assert.is_nil(seen.spec.name:find("[A-F]"))
    assert.equal(256, seen.spec.memoryMb)
    assert.equal(1, seen.spec.cpus)
    assert.equal(32, seen.spec.pids)
    assert.equal(r_root, seen.spec.runDir:match("^(.*)/precheck%-%w%w%w%w%w%w$"))
    assert.equal(r_root, seen.spec.workspaceDir:match("^(.*)/precheck%-ws%-%w%w%w%w%w%w$"))
    assert.same({}, P.entries(r_root))
  end)

  it("rejects an ok:false answer with its error text cut to 1,000 characters (behaviour 19)", function()
    local long = string.rep("é", 1500)
    local r = sandbox.precheckScriptRunner(P.options(root(), {}, {
      driver = P.driver(P.answer(json.encode(json.object({ "ok", "error" }, { ok = false, error = long })))) }))
    local ok, err = pcall(run, function() return r.run("x", P.context()) end)
    assert.is_false(ok)
    assert.equal(1000, utf8.len(err))
    assert.equal(string.rep("é", 1000), err)
    r = sandbox.precheckScriptRunner(P.options(root(), {}, { driver = P.driver(P.answer('{"ok":false,"error":7}')) }))
    ok, err = pcall(run, function() return r.run("x", P.context()) end)
    assert.equal("the script failed", err)
  end)

  it("rejects unreadable stdout with the precheck worker answered nothing it could read (behaviour 20)", function()
    for _, out in ipairs { "", "noise\n{\"ok\":true}", '{"ok":"yes"}', "[]", '\239\187\191{"ok":true}', "{\"ok\":true,\"result\":\"\255\"}" } do
      local root_dir = root()
      local r = sandbox.precheckScriptRunner(P.options(root_dir, {}, { driver = P.driver(P.answer(out)) }))
      local ok, err = pcall(run, function() return r.run("x", P.context()) end)
      assert.is_false(ok)
      assert.equal("the precheck worker answered nothing it could read", err)
      assert.same({}, P.entries(root_dir))
    end
    local r = sandbox.precheckScriptRunner(P.options(root(), {}, { driver = P.driver(P.answer('{"ok":true,"result":null}')) }))
    assert.is_nil(run(function() return r.run("x", P.context()) end))
  end)

  it("rejects input over 64 KiB with precheck script too large and starts nothing (behaviour 24)", function()
    local d = P.driver(P.answer(ANSWER_OK))
    local r_root = root()
    local r = sandbox.precheckScriptRunner(P.options(r_root, {}, { driver = d }))
    local ok, err = pcall(run, function() return r.run(string.rep("x", 65536), P.context()) end)
    assert.is_false(ok)
    assert.equal("precheck script too large", err)
    assert.equal(0, #d.calls)
    assert.same({}, P.entries(r_root))
  end)

  it("rejects with the signal's reason when it has already aborted, creating nothing", function()
    local d = P.driver(P.answer(ANSWER_OK))
    local r_root = root()
    local grants = 0
    local r = sandbox.precheckScriptRunner(P.options(r_root, function() grants = grants + 1 return {} end, { driver = d }))
    local sig = require("sandbox.signal").new()
    sig:abort("host stopping")
    local ok, err = pcall(run, function() return r.run("x", P.context { signal = sig }) end)
    assert.is_false(ok)
    assert.equal("host stopping", err)
    assert.equal(0, grants)
    assert.equal(0, #d.calls)
  end)

  it("aborts the run with precheck script timed out when the backstop fires, and runRoot is left empty", function()
    local r_root = root()
    local d = P.driver(function(_, _, sig)
      async.await(function(resume) sig:on_abort(resume) end)
      error(sig.reason, 0)
    end)
    local r = sandbox.precheckScriptRunner(P.options(r_root, {}, { driver = d, timeoutMs = 1000 }))
    local ok, err = pcall(run, function() return r.run("x", P.context()) end)
    assert.is_false(ok)
    assert.equal("precheck script timed out", err)
    assert.same({}, P.entries(r_root))
  end)

  it("passes the core's abort reason through and cuts the broker's calls when the core aborts mid-run", function()
    local sig = require("sandbox.signal").new()
    local d = P.driver(function(spec, _, run_sig)
      core.timer(50, function() sig:abort("host stopped") end)
      async.await(function(resume) run_sig:on_abort(resume) end)
      local after = P.run_post(spec, "/mcp/health", P.call_body("garmin-login"))
      assert.equal(410, after.status)
      error(run_sig.reason, 0)
    end)
    local r = sandbox.precheckScriptRunner(P.options(root(), health_grant, { driver = d }))
    local ok, err = pcall(run, function()
      return r.run("x", P.context { signal = sig, tools = { { server = "health", tool = "garmin-login" } } })
    end)
    assert.is_false(ok)
    assert.equal("host stopped", err)
  end)
end)

describe("precheck runner: container arguments (precheck.md 6.1)", function()
  local function args(over)
    local base = P.tmpdir()
    F.keep(base)
    local run_dir, ws = base .. "/precheck-abcdef", base .. "/precheck-ws-abcdef"
    assert(core.fs_mkdir(run_dir))
    assert(core.fs_mkdir(ws))
    local o = {
      image = "pi-roundtable-sandbox:precheck", uid = 1000, gid = 1000, entrypoint = sandbox.PRECHECK_ENTRYPOINT,
      limits = { memoryMb = 256, cpus = 1, pids = 32 },
    }
    for k, v in pairs(over or {}) do o[k] = v end
    local spec = sandbox.precheck.container_spec(o, "roundtable-precheck-13-0123abcd", run_dir, ws)
    if o.workspaceReadOnly ~= nil then spec.workspaceReadOnly = o.workspaceReadOnly end
    return sandbox.precheck.container_args(spec), run_dir, ws
  end

  it("holds the sealed settings, the 256m/1/32 limits and --entrypoint /usr/local/bin/bun, in order (behaviour 11)", function()
    local a, run_dir, ws = args()
    assert.same({
      "run", "--rm", "--interactive", "--sig-proxy=false", "--log-driver", "none", "--pull", "never",
      "--name", "roundtable-precheck-13-0123abcd",
      "--network", "none", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
      "--user", "1000:1000", "--memory", "256m", "--memory-swap", "256m", "--cpus", "1", "--pids-limit", "32",
      "--ulimit", "nofile=256:256", "--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=64m,mode=1777",
      "--mount", "type=bind,src=" .. run_dir .. ",dst=/broker,readonly,bind-propagation=rprivate",
      "--mount", "type=bind,src=" .. ws .. ",dst=/workspace,readonly,bind-propagation=rprivate",
      "--env", "HOME=/tmp/home", "--entrypoint", "/usr/local/bin/bun",
      "pi-roundtable-sandbox:precheck", "/app/precheck-main.mjs",
    }, a)
    local half = args { limits = { memoryMb = 512, cpus = 0.5, pids = 64 } }
    local at
    for i, v in ipairs(half) do if v == "--cpus" then at = i end end
    assert.equal("0.5", half[at + 1])
  end)

  it("mounts the workspace readonly only when read-only (behaviour 12)", function()
    local ro, _, ws = args()
    local rw = args { workspaceReadOnly = false }
    local function mount(a)
      for i, v in ipairs(a) do if v:find("dst=/workspace", 1, true) then return a[i] end end
    end
    local function ends(s, tail) return s:sub(-#tail) == tail end
    assert.is_true(ends(mount(ro), "dst=/workspace,readonly,bind-propagation=rprivate"))
    assert.is_true(ends(mount(rw), "dst=/workspace,bind-propagation=rprivate"))
    assert.is_nil(mount(rw):find("readonly", 1, true))
    assert.truthy(mount(ro):find("src=" .. ws, 1, true))
  end)

  it("follows the image only with the entry script's path (behaviour 13)", function()
    local a = args()
    assert.equal("pi-roundtable-sandbox:precheck", a[#a - 1])
    assert.equal("/app/precheck-main.mjs", a[#a])
    local more = args { entrypoint = { "/usr/local/bin/bun", "/app/precheck-main.mjs", "extra" } }
    assert.same({ "pi-roundtable-sandbox:precheck", "/app/precheck-main.mjs", "extra" }, { table.unpack(more, #more - 2) })
  end)

  it("refuses an entrypoint part starting with - with invalid entrypoint (behaviour 14)", function()
    local ok, err = pcall(args, { entrypoint = { "/usr/local/bin/bun", "-e", "1" } })
    assert.is_false(ok)
    assert.equal("invalid entrypoint", err)
    ok, err = pcall(args, { entrypoint = { "-x" } })
    assert.equal("invalid entrypoint", err)
  end)

  it("keeps mount sources apart and canonical", function()
    local base = P.tmpdir()
    F.keep(base)
    local spec = sandbox.precheck.container_spec({ image = "i", uid = 1, gid = 1, entrypoint = { "/b" } },
      "roundtable-precheck-1-00000000", base, base .. "/ws")
    assert(core.fs_mkdir(base .. "/ws"))
    local ok, err = pcall(sandbox.precheck.container_args, spec)
    assert.is_false(ok)
    assert.equal("broker and workspace mounts must be separate", err)
  end)
end)
