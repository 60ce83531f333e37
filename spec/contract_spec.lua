-- contract_spec.lua: the driver contract (lua/sandbox/drivers/contract.lua):
-- the 4.6 run and 4.7 removal algorithms over the primitives a driver
-- provides, checked on a scripted primitive driver so the order of the
-- steps is visible (what a new driver, warm or Kubernetes, has to supply).
-- The two real drivers run the same function against a fake docker binary
-- (driver_cli_spec) and a fake daemon (driver_engine_spec).
local async = require "sandbox.async"
local container = require "sandbox.drivers._sealed"
local contract = require "sandbox.drivers.contract"
local core = require "sandbox.core"
local signal = require "sandbox.signal"
local spec_fs = require "spec_fs"

local CLEANUP = "sandbox container cleanup failed; inspect this installation's containers"
local NAME = "roundtable-sandbox-0123456789abcdef-89abcdef"
local TURN = { text = "hello", speaker = { id = "guest", name = "Guest" }, model = "m",
  prompt = "p", timeZone = "UTC", reset = false, tools = {}, mcp = {} }

-- A driver made of scripted primitives; `log` lists the calls in order.
-- script = {create_failed=, stdout=, truncated=, exit=, unstarted=,
-- removals = {"retry", "ok", ...} (default "ok"), on_start = fn(h)}.
local function scripted(script)
  local d = { log = {}, removals = script.removals or {}, remove_timeout_ms = 5000 }
  local function note(s) d.log[#d.log + 1] = s end
  function d:create(c, sig)
    note("create " .. c.name)
    local h = { signal = sig, failed = script.create_failed }
    if sig then h.unhook = sig:on_abort(function() note("abort") end) end
    return h
  end
  function d:start(h, input, max_stdout)
    note("start")
    h.input = input
    d.max_stdout = max_stdout
    if script.on_start then script.on_start(h) end
  end
  function d:read(h)
    note("read")
    if script.unstarted then return nil, nil, script.unstarted end
    return script.stdout or "", script.truncated == true
  end
  function d:wait(h)
    note("wait")
    return script.exit
  end
  function d:release(h)
    note("release")
    if h.unhook then h.unhook() end
  end
  function d:remove_once(name)
    note("remove " .. name)
    return table.remove(d.removals, 1) or "ok"
  end
  function d:list_once(installation)
    note("list " .. installation)
    return script.list
  end
  return d
end

local dir
local function spec()
  return {
    name = NAME, image = "img", runDir = dir .. "/run", workspaceDir = dir .. "/ws",
    uid = 1000, gid = 1000, memoryMb = 512, cpus = 1, pids = 64,
    labels = container.labels(string.rep("a", 64), "owner"),
  }
end

local function run(d, s, sig)
  return async.run(function() return pcall(contract.run, d, s or spec(), TURN, sig) end)
end

describe("contract.run (spec/runtime.md 4.6)", function()
  setup(function()
    dir = spec_fs.tmpdir("sbx-spec")
    os.execute("mkdir -p '" .. dir .. "/run' '" .. dir .. "/ws'")
  end)
  teardown(function() spec_fs.rmdir(dir, "sbx-spec") end)

  it("creates, starts with the turn's bytes, reads, waits, releases, then removes once", function()
    local d = scripted { stdout = '{"ok":true,"text":"Done."}', exit = 0 }
    local ok, res = run(d)
    assert.is_true(ok, tostring(res))
    assert.same({ ok = true, text = "Done." }, res)
    assert.same({ "create " .. NAME, "start", "read", "wait", "release", "remove " .. NAME }, d.log)
  end)

  it("hands start the 8.2 bytes of drivers/_sealed.lua", function()
    local seen
    local d = scripted { stdout = '{"ok":true,"text":"x"}', exit = 0, on_start = function(h) seen = h.input end }
    run(d)
    assert.equal(container.turn_json(TURN), seen)
  end)

  it("raises the 4.2 error and then the labels error before creating anything", function()
    local d = scripted {}
    local s = spec()
    s.uid = 0
    local _, err = run(d, s)
    assert.equal("sandbox requires a non-root user and group", err)
    s = spec()
    s.labels = {}
    _, err = run(d, s)
    assert.equal("invalid container labels", err)
    assert.same({}, d.log)
  end)

  it("an already aborted signal creates and removes nothing (step 2)", function()
    local d = scripted {}
    local sig = signal.new()
    sig:abort("sandbox turn stopped")
    local ok, err = run(d, nil, sig)
    assert.is_false(ok)
    assert.equal("sandbox turn stopped", err)
    assert.same({}, d.log)
  end)

  it("nothing started (the spawn error) is raised after release, with no removal", function()
    local d = scripted { unstarted = "cannot start docker: no such file or directory" }
    local ok, err = run(d)
    assert.is_false(ok)
    assert.equal("cannot start docker: no such file or directory", err)
    assert.same({ "create " .. NAME, "start", "read", "release" }, d.log)
  end)

  it("a non-zero or unknown exit is sandbox worker failed with a second removal", function()
    for _, exit in ipairs { 1, 137, false } do
      local d = scripted { stdout = '{"ok":true,"text":"Done."}', exit = exit or nil }
      local ok, err = run(d)
      assert.is_false(ok)
      assert.equal("sandbox worker failed", err)
      assert.same({ "remove " .. NAME, "remove " .. NAME }, { d.log[6], d.log[7] })
      assert.equal(7, #d.log)
    end
  end)

  it("a refused create still reads, waits and removes twice (the daemon may have made it)", function()
    local d = scripted { create_failed = true }
    local ok, err = run(d)
    assert.is_false(ok)
    assert.equal("sandbox worker failed", err)
    assert.equal(7, #d.log)
  end)

  it("truncated output wins over the exit status; an abort over exit and reply", function()
    local d = scripted { stdout = "x", truncated = true, exit = 1 }
    local _, err = run(d)
    assert.equal("body too large", err)
    local sig = signal.new()
    d = scripted { stdout = '{"ok":true,"text":"Done."}', exit = 0,
      on_start = function() sig:abort("sandbox turn timed out") end }
    local ok
    ok, err = run(d, nil, sig)
    assert.is_false(ok)
    assert.equal("sandbox turn timed out", err)
    assert.same({ "create " .. NAME, "start", "abort", "read", "wait", "release",
      "remove " .. NAME, "remove " .. NAME }, d.log)
  end)

  it("a removal failure replaces a good reply (step 10)", function()
    local d = scripted { stdout = '{"ok":true,"text":"Done."}', exit = 0, removals = { "fail" } }
    local ok, err = run(d)
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
  end)
end)

describe("contract.remove (spec/runtime.md 4.7)", function()
  local function remove(removals, name)
    local d = scripted { removals = removals }
    local ok, err, ms = async.run(function()
      local t0 = core.now()
      local ok, err = pcall(contract.remove, d, name or NAME)
      return ok, err, core.now() - t0
    end)
    return ok, err, d.log, ms
  end

  it("retries only 'retry', up to three attempts, 100 then 200 ms apart", function()
    local ok, _, log = remove { "retry", "ok" }
    assert.is_true(ok)
    assert.equal(2, #log)
    local err, ms
    ok, err, log, ms = remove { "retry", "retry", "retry" }
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.equal(3, #log)
    assert.is_true(ms >= 300, "slept 100 + 200 ms: " .. ms)
    ok, err, log = remove { "fail" }
    assert.equal(CLEANUP, err)
    assert.equal(1, #log)
  end)

  it("refuses a name outside the 4.2 name rule without asking the driver", function()
    for _, bad in ipairs { "", "-x", "Upper", string.rep("a", 92), 7 } do
      local ok, err, log = remove({}, bad)
      assert.is_false(ok)
      assert.equal(CLEANUP, err)
      assert.same({}, log)
    end
  end)
end)

describe("contract.list (spec/runtime.md 6.3 step 1)", function()
  it("returns the driver's listing; a failed listing or a bad installation id is the cleanup error", function()
    local list = { { name = NAME, owner = "o" } }
    assert.same(list, async.run(function() return contract.list(scripted { list = list }, "ab12") end))
    local d = scripted {}
    assert.has_error(function() async.run(function() return contract.list(d, "ab12") end) end, CLEANUP)
    assert.has_error(function() async.run(function() return contract.list(d, "not hex") end) end, CLEANUP)
    assert.same({ "list ab12" }, d.log)
  end)
end)

describe("contract.local_endpoint (spec/runtime.md 4.5)", function()
  it("accepts an unset DOCKER_HOST and unix://<absolute path> only", function()
    assert.is_true(contract.local_endpoint(nil))
    assert.is_true(contract.local_endpoint(""))
    assert.is_true(contract.local_endpoint("unix:///run/docker.sock"))
    assert.is_false(contract.local_endpoint("unix://run/docker.sock"))
    assert.is_false(contract.local_endpoint("tcp://127.0.0.1:2375"))
    assert.is_false(contract.local_endpoint("ssh://host"))
  end)
end)

describe("contract.methods", function()
  it("gives a class of primitives the spec 4.1 run, list and remove", function()
    local class = contract.methods({})
    for _, m in ipairs { "run", "list", "remove" } do assert.is_function(class[m]) end
    local cli, engine = require "sandbox.drivers.cli", require "sandbox.drivers.engine"
    for _, d in ipairs { cli {}, engine {} } do
      for _, m in ipairs { "run", "list", "remove", "create", "start", "read", "wait", "release",
                           "remove_once", "list_once" } do
        assert.is_function(d[m], m)
      end
    end
  end)
end)

describe("contract.attached (the precheck runner's run)", function()
  setup(function()
    dir = spec_fs.tmpdir("sbx-spec")
    os.execute("mkdir -p '" .. dir .. "/run' '" .. dir .. "/ws'")
  end)
  teardown(function() spec_fs.rmdir(dir, "sbx-spec") end)

  it("hands the driver its stdout bound, returns stdout raw (or through check) and removes once", function()
    local d = scripted { stdout = '{"ok":true}', exit = 0 }
    local c = container.check(spec())
    local out = async.run(function() return contract.attached(d, c, "input bytes", nil, { max_stdout = 65536 }) end)
    assert.equal('{"ok":true}', out)
    assert.equal(65536, d.max_stdout)
    assert.same({ "create " .. NAME, "start", "read", "wait", "release", "remove " .. NAME }, d.log)
    d = scripted { stdout = "x", exit = 0 }
    local ok, err = async.run(function()
      return pcall(contract.attached, d, c, "", nil, { check = function() error("refused", 0) end })
    end)
    assert.is_false(ok)
    assert.equal("refused", err)
    assert.equal(contract.MAX_STDOUT, d.max_stdout)
  end)

  -- The long-lived lifecycle (drivers/_lasting.lua, rich-mode.md 5.4) over
  -- scripted primitives: `state` is the container the daemon has (nil:
  -- missing); `log` lists the primitive calls in order.
  local function lasting_driver(state, o)
    o = o or {}
    local d = { log = {} }
    local function note(s) d.log[#d.log + 1] = s end
    function d:render_lasting(spec, logcfg)
      note("render " .. spec.name)
      if o.render_error then error(o.render_error, 0) end
      return { name = spec.name, image = spec.image, profile = spec.profile, rendered = { logcfg = logcfg } }
    end
    function d:inspect_container(name)
      note("inspect " .. name)
      if o.inspect_error then error(o.inspect_error, 0) end
      return state
    end
    function d:create_lasting(r)
      note("create " .. r.name)
      if o.create_error then error(o.create_error, 0) end
    end
    function d:start_lasting(name) note("start " .. name) end
    function d:remove_lasting(name) note("remove " .. name) end
    function d:lasting_logs(name, n)
      note("logs " .. name .. " " .. n)
      return "text"
    end
    return d
  end

  local RNAME = "roundtable-sandbox-discord_party"
  local RSPEC = { name = RNAME, image = "img:1", profile = "main" }
  local LABEL = "roundtable.sandbox.profile"

  it("status: missing, running or stopped, with the image and the profile label the container carries", function()
    assert.are.same({ state = "missing" }, contract.status(lasting_driver(nil), RNAME, LABEL))
    assert.are.same({ state = "running", image = "img:1", profile = "main" }, contract.status(lasting_driver(
      { running = true, image = "img:1", labels = { [LABEL] = "main", other = "x" } }), RNAME, LABEL))
    assert.are.same({ state = "stopped" },
      contract.status(lasting_driver({ running = false, labels = { other = "main" } }), RNAME, LABEL))
  end)

  it("ensure_running: a running container of the same image and profile is kept (no create, no start)", function()
    local d = lasting_driver({ running = true, image = "img:1", labels = { [LABEL] = "main" } })
    contract.ensure_running(d, RSPEC, {}, LABEL)
    assert.are.same({ "render " .. RNAME, "inspect " .. RNAME }, d.log)
  end)

  for _, case in ipairs {
    { "another image", { running = true, image = "img:0", labels = { [LABEL] = "main" } } },
    { "another profile", { running = true, image = "img:1", labels = { [LABEL] = "other" } } },
    { "no profile label", { running = true, image = "img:1", labels = {} } },
    { "a stopped one", { running = false, image = "img:1", labels = { [LABEL] = "main" } } },
  } do
    it("ensure_running: " .. case[1] .. " is removed, then the container is created and started", function()
      local d = lasting_driver(case[2])
      contract.ensure_running(d, RSPEC, {}, LABEL)
      assert.are.same({ "render " .. RNAME, "inspect " .. RNAME, "remove " .. RNAME, "create " .. RNAME,
        "start " .. RNAME }, d.log)
    end)
  end

  it("ensure_running: a missing container is created and started, nothing removed", function()
    local d = lasting_driver(nil)
    contract.ensure_running(d, RSPEC, {}, LABEL)
    assert.are.same({ "render " .. RNAME, "inspect " .. RNAME, "create " .. RNAME, "start " .. RNAME }, d.log)
  end)

  it("ensure_running: a rendering refused, a status or a create that fails stops it there, with that error", function()
    local d = lasting_driver(nil, { render_error = "Invalid container specification" })
    assert.has_error(function() contract.ensure_running(d, RSPEC, {}, LABEL) end, "Invalid container specification")
    assert.are.same({ "render " .. RNAME }, d.log)
    d = lasting_driver(nil, { inspect_error = "docker GET /x failed: timeout" })
    assert.has_error(function() contract.ensure_running(d, RSPEC, {}, LABEL) end, "docker GET /x failed: timeout")
    assert.are.same({ "render " .. RNAME, "inspect " .. RNAME }, d.log)
    d = lasting_driver(nil, { create_error = "docker create x failed with 125: no such image" })
    assert.has_error(function() contract.ensure_running(d, RSPEC, {}, LABEL) end,
      "docker create x failed with 125: no such image")
    assert.are.same({ "render " .. RNAME, "inspect " .. RNAME, "create " .. RNAME }, d.log)
  end)

  it("logs asks for max(1, floor(lines)) lines; remove is one forced removal", function()
    local d = lasting_driver(nil)
    assert.are.equal("text", contract.logs(d, RNAME, 40.7))
    contract.logs(d, RNAME, 0)
    contract.logs(d, RNAME, "x")
    contract.remove_lasting(d, RNAME)
    assert.are.same({ "logs " .. RNAME .. " 40", "logs " .. RNAME .. " 1", "logs " .. RNAME .. " 1",
      "remove " .. RNAME }, d.log)
  end)

  it("a name that could be read as an option or a path never reaches a primitive", function()
    for _, name in ipairs { "-v", "--force", "a/../b", "A", "", "x y", string.rep("a", 92) } do
      local d = lasting_driver(nil)
      assert.has_error(function() contract.status(d, name, LABEL) end, "Invalid container specification")
      assert.has_error(function() contract.remove_lasting(d, name) end, "Invalid container specification")
      assert.has_error(function() contract.logs(d, name, 5) end, "Invalid container specification")
      assert.has_error(function() contract.ensure_running(d, { name = name, image = "i", profile = "p" }, {}, LABEL) end,
        "Invalid container specification")
      assert.are.same({}, d.log)
    end
  end)
end)
