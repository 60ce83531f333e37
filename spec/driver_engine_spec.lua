-- driver_engine_spec.lua: the Engine API driver against a scripted fake
-- daemon on a Unix socket (spec/fixtures/fake_docker_api.mjs): the request
-- sequence and body of 4.3/4.6, stdin after the attach 101, frame limits,
-- the wait status, aborts and the DELETE removal algorithm of 4.7.
local async = require "sandbox.async"
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local engine = require "sandbox.drivers.engine"
local json = require "sandbox.json"
local rich_docker_fake = require "rich_docker_fake"
local signal = require "sandbox.signal"
local spec_fs = require "spec_fs"

local CLEANUP = "sandbox container cleanup failed; inspect this installation's containers"
local INST = string.rep("b", 64)
local OWNER = "0f8fad5b-d9cb-469f-a165-70867728950e:1:2"
local TURN = { text = "hello", speaker = { id = "guest", name = "Guest" }, model = "fake",
  prompt = "p", timeZone = "UTC", reset = false, tools = {}, mcp = {} }

local sh, write = spec_fs.sh, spec_fs.write

local function node_path()
  local p = sh("command -v node 2>/dev/null")
  return p ~= "" and p or nil
end

describe("Engine API driver (fake daemon)", function()
  local dir, sock, node, proc, node_exited

  setup(function()
    node = node_path()
    assert(node, "node is required for the fake daemon (make deps installs it)")
    dir = spec_fs.tmpdir("sbx-spec")
    os.execute("mkdir -p '" .. dir .. "/run' '" .. dir .. "/ws'")
    sock = dir .. "/docker.sock"
    write(dir .. "/script.json", "{}")
    proc = core.spawn {
      file = node, args = { "spec/fixtures/fake_docker_api.mjs", sock, dir .. "/script.json", dir .. "/log.jsonl" },
      env = {}, on_exit = function() node_exited = true end,
    }
    async.run(function()
      for _ = 1, 100 do
        if core.fs_lstat(sock) then return end
        async.sleep(20)
      end
      error("the fake daemon did not start")
    end)
  end)

  teardown(function()
    if proc then
      proc:kill(core.SIGKILL)
      while not node_exited do core.run("once") end   -- reaped: the loop ends empty
    end
    if dir then spec_fs.rmdir(dir, "sbx-spec") end
  end)

  local function script(t) write(dir .. "/script.json", assert(json.encode(t))) end

  local function reset(t)
    os.remove(dir .. "/log.jsonl")
    script(t or {})
  end

  local function log()
    local out = {}
    local f = io.open(dir .. "/log.jsonl")
    if not f then return out end
    for line in f:lines() do out[#out + 1] = json.decode(line) end
    f:close()
    return out
  end

  local function count(method)
    local n = 0
    for _, e in ipairs(log()) do if e.method == method then n = n + 1 end end
    return n
  end

  local function spec()
    return {
      name = container.name(core.sha256_hex("fake:engine")), image = "pi-roundtable-sandbox:local",
      runDir = dir .. "/run", workspaceDir = dir .. "/ws", uid = 1000, gid = 1000,
      memoryMb = 512, cpus = 1, pids = 64, labels = container.labels(INST, OWNER),
    }
  end

  local function run(s, sig, opts)
    local d = engine(opts or { socket = sock })
    return async.run(function()
      local t0 = core.now()
      local ok, res = pcall(d.run, d, s or spec(), TURN, sig)
      return ok, res, core.now() - t0
    end)
  end

  -- the fake restarts its DELETE answers at every create
  it("makes the 4.3 body, attaches before start, writes stdin after 101 and returns only {ok, text}", function()
    reset { stdout = '{"ok":true,"text":"Done."}', deletes = { { status = 404, body = "{}" } } }
    local s = spec()
    local ok, res = run(s)
    assert.is_true(ok, tostring(res))
    assert.same({ ok = true, text = "Done." }, res)
    local l = log()
    local seq = {}
    for _, e in ipairs(l) do seq[#seq + 1] = e.method .. " " .. e.url end
    assert.equal("POST /containers/create?name=" .. s.name, seq[1])
    assert.equal(container.engine_body(s), l[1].body)
    -- attach is logged when its stdin ends; wait and start come first in the log
    assert.same({
      "POST /containers/" .. s.name .. "/wait?condition=next-exit",
      "POST /containers/" .. s.name .. "/start",
      "POST /containers/" .. s.name .. "/attach?stream=1&stdin=1&stdout=1&stderr=1",
      "DELETE /containers/" .. s.name .. "?force=1",
    }, { seq[2], seq[3], seq[4], seq[5] })
    assert.equal(container.turn_json(TURN), l[4].stdin)
    assert.equal(5, #l)
  end)

  it("a missing image (create 404) is the image_missing error, with two removals", function()
    reset { create = 404, deletes = { { status = 404, body = "{}" } } }
    local ok, err = run()
    assert.is_false(ok)
    assert.equal("sandbox image is missing", err)
    assert.equal(2, count("DELETE"))
  end)

  it("exit 137 with the daemon's oom event is the worker_oom error; without it, a failed worker", function()
    reset { exit = 137, oom = true }
    local ok, err = run()
    assert.is_false(ok)
    assert.equal("sandbox worker was killed for memory", err)
    reset { exit = 137 }
    ok, err = run()
    assert.is_false(ok)
    assert.equal("sandbox worker failed", err)
  end)

  it("a non-zero wait status is sandbox worker failed even with a valid reply", function()
    reset { stdout = '{"ok":true,"text":"Done."}', exit = 137, deletes = { { status = 404 } } }
    local ok, err = run()
    assert.is_false(ok)
    assert.equal("sandbox worker failed", err)
    assert.equal(2, count("DELETE"))
  end)

  it("another stream type is sandbox worker failed", function()
    reset { stdout = '{"ok":true,"text":"Done."}', badStream = true, deletes = { { status = 404 } } }
    local ok, err = run()
    assert.is_false(ok)
    assert.equal("sandbox worker failed", err)
  end)

  it("stdout over 2 MiB and stderr over 128 KiB are body too large", function()
    reset { stdoutBytes = 2097153, deletes = { { status = 404 } } }
    local ok, err = run()
    assert.is_false(ok)
    assert.equal("body too large", err)
    reset { stdout = '{"ok":true,"text":"Done."}', stderrBytes = 131073, deletes = { { status = 404 } } }
    ok, err = run()
    assert.is_false(ok)
    assert.equal("body too large", err)
    reset { stdout = '{"ok":true,"text":"Done."}', stderrBytes = 131072, deletes = { { status = 404 } } }
    ok = run()
    assert.is_true(ok)
  end)

  it("409 'already in progress' is retried and 404 counts as removed", function()
    reset { stdout = '{"ok":true,"text":"Done."}', deletes = {
      { status = 409, body = '{"message":"removal of container x is already in progress"}' },
      { status = 404, body = '{"message":"No such container: x"}' } } }
    local ok, res = run()
    assert.is_true(ok, tostring(res))
    assert.equal(2, count("DELETE"))
  end)

  it("three 409 answers give the cleanup error after exactly three attempts", function()
    reset { stdout = '{"ok":true,"text":"Done."}', deletes = {
      { status = 409, body = '{"message":"removal of container x is already in progress"}' } } }
    local ok, err = run()
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.equal(3, count("DELETE"))
  end)

  it("another DELETE answer fails after one attempt, replacing a good reply", function()
    reset { stdout = '{"ok":true,"text":"Done."}', deletes = { { status = 500, body = '{"message":"boom"}' } } }
    local ok, err = run()
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.equal(1, count("DELETE"))
  end)

  it("a hanging DELETE is cut off by the removal deadline", function()
    reset { stdout = '{"ok":true,"text":"Done."}', deletes = { { hang = true } } }
    local ok, err, ms = run(nil, nil, { socket = sock, remove_timeout_ms = 300 })
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.equal(1, count("DELETE"))
    assert.is_true(ms >= 300 and ms < 2000, ms)
  end)

  it("an abort closes every connection, raises the reason and removes twice", function()
    reset { hang = true, deletes = { { status = 204 } } }
    local sig = signal.new()
    local ok, err, ms = async.run(function()
      core.timer(200, function() sig:abort("sandbox turn timed out") end)
      local d = engine { socket = sock }
      local t0 = core.now()
      local ok, err = pcall(d.run, d, spec(), TURN, sig)
      return ok, err, core.now() - t0
    end)
    assert.is_false(ok)
    assert.equal("sandbox turn timed out", err)
    assert.is_true(ms < 1500, ms)
    assert.equal(2, count("DELETE"))
  end)

  it("an already aborted signal sends nothing", function()
    reset {}
    local sig = signal.new()
    sig:abort("sandbox turn stopped")
    local ok, err = run(nil, sig)
    assert.is_false(ok)
    assert.equal("sandbox turn stopped", err)
    assert.same({}, log())
  end)

  it("an unreachable daemon fails the run with the daemon error (its removal could not be tried)", function()
    local ok, err = run(nil, nil, { socket = dir .. "/nothing.sock" })
    assert.is_false(ok)
    assert.equal("the Docker daemon did not answer", err)
  end)

  it("lists by the installation label filter", function()
    reset { list = { { Names = { "/roundtable-sandbox-0123456789abcdef-01234567" },
      Labels = { ["roundtable.sandbox.owner"] = OWNER } }, { Names = { "/x" } } } }
    local d = engine { socket = sock }
    local list = async.run(function() return d:list(INST) end)
    assert.same({ { name = "roundtable-sandbox-0123456789abcdef-01234567", owner = OWNER },
      { name = "x", owner = "" } }, list)
    local url = log()[1].url
    assert.equal("/containers/json?all=1&filters=%7B%22label%22%3A%5B%22roundtable.sandbox.installation%3D"
      .. INST .. "%22%5D%7D", url)
  end)

  it("lists the daemon's registered runtimes from GET /info .Runtimes (warm-turns.md 4)", function()
    local d = engine { socket = sock }
    reset {}
    assert.same({ runc = { path = "runc", args = {} } }, async.run(function() return d:runtimes() end))
    reset { runtimes = { runc = { path = "runc" }, runsc = { path = "/usr/bin/runsc",
      runtimeArgs = { "--network=none", "--fsgofer-host-uds" } } } }
    assert.same({ runc = { path = "runc", args = {} },
      runsc = { path = "/usr/bin/runsc", args = { "--network=none", "--fsgofer-host-uds" } } },
      async.run(function() return d:runtimes() end))
    local set, why = async.run(function() return engine({ socket = dir .. "/nothing.sock" }):runtimes() end)
    assert.is_nil(set)
    assert.equal("no answer", why)
  end)

  it("creates a container with HostConfig.Runtime when the spec names a runtime", function()
    reset { stdout = '{"ok":true,"text":"Done."}' }
    local s = spec()
    s.runtime = "runsc"
    local ok, res = run(s)
    assert.is_true(ok, tostring(res))
    local body = json.decode(log()[1].body)
    assert.equal("runsc", body.HostConfig.Runtime)
  end)

  it("parses chunked and sized answers", function()
    local st, _, body = engine.parse_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert.equal(200, st)
    assert.equal("abcde", body)
    st, _, body = engine.parse_response("HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nabXX")
    assert.equal(404, st)
    assert.equal("ab", body)
    assert.is_nil(engine.parse_response("garbage"))
  end)
end)

-- The long-lived lifecycle through the Engine API driver itself
-- (drivers/_lasting.lua over its primitives, rich-mode.md 5.4), against the
-- scripted Engine API of the rich specs (spec/fixtures/rich_docker_api.mjs).
describe("the Engine API driver's long-lived lifecycle", function()
  local contract = require "sandbox.drivers.contract"
  local rich_docker = require "sandbox.rich.docker"
  local rich_render = require "sandbox.drivers._rich"
  local rich_container = require "sandbox.rich._container"
  local NAME = "roundtable-sandbox-discord_party"
  local LABEL = "roundtable.sandbox.profile"
  local fake, dir, sock

  setup(function()
    fake = rich_docker_fake.start("drv-lasting")
    dir, sock = fake.dir, fake.sock
  end)

  teardown(function() if fake then fake:stop() end end)

  local function state(t) fake:state(t) end
  local function requests() return fake:requests() end

  local function rspec()
    return { name = NAME, image = "pi-roundtable-sandbox:pi", channel = "discord:party", profile = "main",
      timeZone = "UTC", labelChannel = "roundtable.sandbox.channel", labelProfile = LABEL,
      runDir = dir .. "/run", workspaceDir = dir .. "/ws", uid = 1000, gid = 1000 }
  end

  it("ensure_running, status, logs and remove_lasting on the driver: the 5.4 calls, the body byte for byte", function()
    state({ logLines = { { 1, "out\n" }, { 2, "err\n" } } })
    local d = engine { socket = sock }
    local s = rspec()
    local logcfg = rich_container.check(s, nil)
    async.run(function()
      d:ensure_running(s, logcfg, LABEL)
      assert.same({ state = "running", image = s.image, profile = "main" }, d:status(NAME, LABEL))
      assert.equal("out\nerr\n", d:logs(NAME, 3))
      contract.remove_lasting(d, NAME)
      assert.same({ state = "missing" }, d:status(NAME, LABEL))
    end)
    local got = requests()
    local lines = {}
    for i, r in ipairs(got) do lines[i] = r.method .. " " .. r.url end
    assert.same({
      "GET /containers/" .. NAME .. "/json",
      "POST /containers/create?name=" .. NAME,
      "POST /containers/" .. NAME .. "/start",
      "GET /containers/" .. NAME .. "/json",
      "GET /containers/" .. NAME .. "/logs?stdout=1&stderr=1&tail=3",
      "DELETE /containers/" .. NAME .. "?force=true",
      "GET /containers/" .. NAME .. "/json",
    }, lines)
    assert.equal(rich_render.body(s, logcfg), got[2].body)
  end)

  it("rich mode takes the Engine API driver as its driver option and runs the same lifecycle", function()
    state({})
    local adapted = rich_docker.adapt(engine { socket = sock, getenv = function() return nil end }, LABEL)
    async.run(function() adapted.ensureRunning(rspec()) end)
    assert.equal(3, #requests())
    assert.is_truthy(requests()[2].url:find("^/containers/create%?name="))
  end)

  it("a supplied Engine API driver whose DOCKER_HOST is remote is refused", function()
    assert.has_error(function()
      rich_docker.new { driver = engine { getenv = function(k) return ({ DOCKER_HOST = "tcp://h:2375" })[k] end } }
    end, "remote Docker daemons are unsupported")
  end)

  it("rich.dockerDriver refuses a driver that is not a contract driver, naming the two it takes", function()
    assert.has_error(function() rich_docker.new { driver = { ensureRunning = function() end } } end,
      "sandbox.rich.dockerDriver: driver must be require('sandbox.drivers').cli{} or .engine{}")
  end)
end)
