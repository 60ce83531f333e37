-- runtime_spec.lua: the sealed runtime with Lua fake drivers over the real
-- broker socket (spec/runtime.md "Behaviours the specs must cover": Options
-- and startup 1-12, Turn lifecycle 27-42, startFresh 43-45; spec/broker.md
-- 9-18 and 59). Item numbers are in the `it` names: R<n> for runtime.md,
-- B<n> for broker.md.
--
-- The runtime refuses uid 0, so everything past construction step 10 runs
-- only as a non-root account (make check runs the specs as `sbx`); as root
-- those cases are pending and say so.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local sandbox = require "sandbox"
local runtime = require "sandbox.runtime"
local options = require "sandbox.runtime._options"
local fake = require "fake_driver"
local fake_upstream = require "fake_upstream"
local spec_fs = require "spec_fs"

local run = async.run
local KEY = "real-host-key-7f3a"
local GUEST = { id = "guest", name = "Guest", principalId = "p_guest" }

local sh = spec_fs.sh

local roots = {}

-- A fresh 0700 temp root (canonical path), short enough for the socket budget.
local function tmproot() return spec_fs.tmpdir("rt", roots, spec_fs.short_tmp()) end

local function entries(dir)
  local list = assert(core.fs_readdir(dir))
  table.sort(list)
  return list
end

local function service_account() return spec_fs.service_account(pending) end

local function options_for(root, over)
  local o = {
    image = "pi-roundtable-sandbox:test",
    runRoot = root .. "/run",
    workspaceRoot = root .. "/work",
    model = "fake",
    modelUrl = "https://models.example/v1/chat/completions",
    apiKey = function() return KEY end,
    driver = fake.new(fake.reply(true, "done")),
  }
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

local function refusal(opts)
  local ok, err = pcall(runtime.new, opts)
  assert.is_false(ok, "construction should fail")
  return err
end

-- Waits (inside a task) until pred() holds, polling every 5 ms, up to 5 s.
local wait_for = spec_fs.wait_for

-- A gate drivers wait on until the spec opens it.
local function gate()
  local g = { open = false, waiters = {} }
  function g.wait()
    if g.open then return end
    async.await(function(resume) g.waiters[#g.waiters + 1] = resume end)
  end
  function g.release()
    g.open = true
    for _, w in ipairs(g.waiters) do w() end
    g.waiters = {}
  end
  return g
end

-- A turn's result reduced to the reply fields {ok, text} (run_turn's result
-- also carries reason, turn, ...: checked where the spec is about them).
local function brief(r)
  if type(r) ~= "table" then return r end
  return { ok = r.ok, text = r.text }
end

-- The reason a settled run_turn ended with (spec/operations.md 1), or the
-- error it raised as "raised: <message>".
local function reason_of(ok, res)
  if not ok then return "raised: " .. tostring(res) end
  return res.reason
end

-- run_turn inside the current task, returning ok, reply-or-error.
local function try_turn(rt, channel, speaker, text)
  return pcall(rt.run_turn, rt, channel, speaker, text)
end

local function spawn_turn(rt, channel, speaker, text)
  return async.spawn(function() return rt:run_turn(channel, speaker, text) end)
end

local function dispose(rt)
  run(function() rt:dispose() end)
end

teardown(function() spec_fs.rmdirs(roots) end)

---------------------------------------------------------------------------
describe("runtime construction (spec/runtime.md 3.1)", function()
  it("R1/B11: refuses a relative runRoot, equal roots, uid 0, gid 0, turnTimeoutMs -1, cpus 0 and an unknown zone", function()
    local root = tmproot()
    assert.equal(options.E_ROOT_PATH, refusal(options_for(root, { runRoot = "run" })))
    assert.equal(options.E_ROOT_SEPARATE, refusal(options_for(root, { workspaceRoot = root .. "/run" })))
    assert.equal(options.E_USER, refusal(options_for(root, { uid = 0 })))
    assert.equal(options.E_USER, refusal(options_for(root, { gid = 0 })))
    assert.equal(options.E_TIMEOUT, refusal(options_for(root, { turnTimeoutMs = -1 })))
    assert.equal(options.E_TIME_ZONE, refusal(options_for(root, { timeZone = "not-a-zone" })))
    service_account()
    assert.equal(options.E_LIMITS, refusal(options_for(root, { limits = { cpus = 0 } })))
  end)

  it("R2: runs the checks in the 3.1 order, first failing check wins", function()
    local root = tmproot()
    local real_linux = options.is_linux
    local o = options_for(root, {
      bogus = true, driver = false, model = " ", apiKey = "key", prompt = "\xff",
      timeZone = "Mars/Base", turnTimeoutMs = 999, runRoot = "relative",
      uid = core.getuid() + 1, limits = { cpus = 0 }, image = "-bad",
      modelUrl = "http://insecure.example",
    })
    local function expect(msg)
      local ok, err = pcall(runtime.new, o)
      assert.is_false(ok)
      assert.equal(msg, err)
    end
    expect("unknown sandbox option: bogus")
    o.bogus = nil
    o.driver = nil
    options.is_linux = function() return false end
    local ok, err = pcall(runtime.new, o)
    options.is_linux = real_linux
    assert.is_false(ok)
    assert.equal(options.E_LINUX, err)
    o.driver = fake.new(fake.reply(true, "x"))
    expect("model is required"); o.model = "fake"
    expect(options.E_APIKEY); o.apiKey = function() return KEY end
    expect(options.E_PROMPT); o.prompt = nil
    expect(options.E_TIME_ZONE); o.timeZone = "Asia/Taipei"
    expect(options.E_TIMEOUT); o.turnTimeoutMs = 1000
    expect(options.E_ROOT_PATH); o.runRoot = root .. "/open"
    os.execute("mkdir -m 755 '" .. root .. "/open'")
    expect(options.E_ROOT_PRIVATE); o.runRoot = root .. "/work/inner"
    expect(options.E_ROOT_SEPARATE)
    service_account()
    o.runRoot = root .. "/" .. string.rep("r", 77 - #root - 1)
    expect(options.E_USER); o.uid = nil
    expect(options.E_SOCKET); o.runRoot = root .. "/run"
    expect(options.E_NAME_IMAGE); o.image = "pi-roundtable-sandbox:test"
    expect(options.E_LIMITS); o.limits = nil
    expect("broker endpoints must be credential-free HTTPS URLs")
    o.modelUrl = "https://models.example/v1"
    local rt = runtime.new(o)
    dispose(rt)
  end)

  it("R3: an unknown option name fails with its name", function()
    local root = tmproot()
    assert.equal("unknown sandbox option: stateFile", refusal(options_for(root, { stateFile = "/x" })))
    assert.equal("unknown sandbox option: colour", refusal(options_for(root, { colour = 1 })))
  end)

  it("R4: a runRoot given as <tmp>/run/../run is accepted and canonicalised", function()
    service_account()
    local root = tmproot()
    assert(core.fs_mkdir(root .. "/run", tonumber("700", 8)))
    local rt = runtime.new(options_for(root, { runRoot = root .. "/run/../run" }))
    assert.equal(root .. "/run", rt.options.runRoot)
    assert.equal(root .. "/work", rt.options.workspaceRoot)
    dispose(rt)
  end)

  it("R5/B10: a pre-existing 0755 directory is refused as runRoot and as workspaceRoot", function()
    local root = tmproot()
    os.execute("mkdir -m 755 '" .. root .. "/run' '" .. root .. "/wide'")
    assert.equal(options.E_ROOT_PRIVATE, refusal(options_for(root)))
    assert.equal(options.E_ROOT_PRIVATE, refusal(options_for(root, { runRoot = root .. "/r2", workspaceRoot = root .. "/wide" })))
    -- the state-directory half of R5/B10 belongs to the channel store (sandbox{}), not built here
  end)

  it("R6/B9: nested roots and a 77-byte canonical runRoot are refused; 76 bytes is accepted", function()
    local root = tmproot()
    assert.equal(options.E_ROOT_SEPARATE, refusal(options_for(root, { runRoot = root .. "/work/run" })))
    assert.equal(options.E_ROOT_SEPARATE, refusal(options_for(root, { workspaceRoot = root .. "/run/work" })))
    service_account()
    local long77 = root .. "/" .. string.rep("a", 77 - #root - 1)
    local long76 = root .. "/" .. string.rep("b", 76 - #root - 1)
    assert.equal(77, #long77)
    assert.equal("broker socket path too long", refusal(options_for(root, { runRoot = long77 })))
    local rt = runtime.new(options_for(root, { runRoot = long76 }))
    assert.equal(76, #rt.options.runRoot)
    -- a turn there still fits its socket path
    local driver = fake.new(function(spec)
      return { ok = true, text = tostring(#(spec.runDir .. "/broker.sock")) }
    end)
    rt.driver = driver
    local reply = run(function() return rt:run_turn("fake:a", GUEST, "hi") end)
    assert.same({ ok = true, text = "100" }, brief(reply))
    dispose(rt)
  end)

  it("R7: cpus 0.0000000001 or a non-integer pids fails with invalid resource limits", function()
    service_account()
    local root = tmproot()
    assert.equal("invalid resource limits", refusal(options_for(root, { limits = { cpus = 0.0000000001 } })))
    assert.equal("invalid resource limits", refusal(options_for(root, { limits = { pids = 8.5 } })))
    assert.equal("invalid resource limits", refusal(options_for(root, { limits = { pids = "64" } })))
    assert.equal("invalid resource limits", refusal(options_for(root, { limits = { disk = 1 } })))
    local rt = runtime.new(options_for(root, { limits = { memoryMb = 64, cpus = 0.000000001, pids = 8.0 } }))
    dispose(rt)
  end)

  it("R8: without a driver on a non-Linux host construction fails; with a fake driver it succeeds", function()
    local root = tmproot()
    local real_linux = options.is_linux
    options.is_linux = function() return false end
    local o = options_for(root)
    o.driver = nil
    local ok, err = pcall(runtime.new, o)
    local ok2, rt = pcall(runtime.new, options_for(root))
    options.is_linux = real_linux
    assert.is_false(ok)
    assert.equal("Docker sandbox execution requires a native Linux host", err)
    if core.getuid() == 0 then
      assert.equal(options.E_USER, rt)   -- past the Linux check, stopped by the uid check
      service_account()
    end
    assert.is_true(ok2, tostring(rt))
    dispose(rt)
  end)

  it("R9: a DOCKER_HOST of tcp://... fails with remote Docker daemons are unsupported", function()
    service_account()
    local root = tmproot()
    local code = ([[
      package.path = %q; package.cpath = %q
      local ok, err = pcall(require("sandbox.runtime").new, {
        image = "pi-roundtable-sandbox:test", runRoot = %q, workspaceRoot = %q,
        model = "fake", modelUrl = "https://models.example/v1", apiKey = function() end })
      io.write(ok and "constructed" or err)
    ]]):format(package.path, package.cpath, root .. "/run", root .. "/work")
    local f = assert(io.open(root .. "/probe.lua", "w"))
    f:write(code)
    f:close()
    local out = sh("DOCKER_HOST=tcp://127.0.0.1:2375 lua5.4 '" .. root .. "/probe.lua' 2>&1")
    assert.equal("remote Docker daemons are unsupported", out)
  end)

  it("R10: a second runtime on the same roots is refused until the first is disposed", function()
    service_account()
    local root = tmproot()
    local a = runtime.new(options_for(root))
    assert.equal("another host process owns these sandbox directories", refusal(options_for(root)))
    dispose(a)
    local b = runtime.new(options_for(root))
    dispose(b)
  end)

  it("R46: the installation id is stable for the same canonical roots and differs for others; the owner names this process", function()
    service_account()
    local root = tmproot()
    local a = runtime.new(options_for(root))
    dispose(a)
    local b = runtime.new(options_for(root, { runRoot = root .. "/run/../run" }))
    dispose(b)
    local c = runtime.new(options_for(root, { runRoot = root .. "/run2" }))
    dispose(c)
    assert.equal(a.installation, b.installation)
    assert.are_not.equal(a.installation, c.installation)
    assert.truthy(a.installation:find("^" .. string.rep("[0-9a-f]", 64) .. "$"))
    local boot = sh("cat /proc/sys/kernel/random/boot_id")
    assert.truthy(a.owner:find("^" .. boot:gsub("%-", "%%-") .. ":" .. core.getpid() .. ":%d+$"))
  end)

  it("dispose outside a task starts the settlement and returns it without waiting", function()
    service_account()
    local root = tmproot()
    local driver = fake.new(fake.until_abort("stopped"))
    local rt = runtime.new(options_for(root, { driver = driver }))
    local t = async.spawn(function() return rt:run_turn("fake:a", GUEST, "hi") end)
    while #driver.calls == 0 do core.run("once") end
    local settlement = rt:dispose()
    while not settlement.done do core.run("once") end
    assert.is_true(t.done)
    assert.same({ ok = false, text = "stopped" }, brief(t.results[2]))
    assert.same({}, entries(root .. "/run"))
  end)

  it("is exposed as sandbox.runtime{...}", function()
    assert.equal(runtime, sandbox.runtime)
  end)
end)

---------------------------------------------------------------------------
describe("one turn (spec/runtime.md 5)", function()
  local root, rt

  local function new_runtime(over)
    service_account()
    root = tmproot()
    rt = runtime.new(options_for(root, over))
    return rt
  end

  after_each(function()
    if rt then dispose(rt) end
    rt = nil
  end)

  it("R37: hands the driver the spec and the ordered turn, and returns the reply", function()
    local speaker = { id = "guest", name = "Guest", principalId = "p_guest" }
    local driver = fake.new(function() return { ok = true, text = "done", extra = 1 } end)
    new_runtime {
      driver = driver, limits = { memoryMb = 256, cpus = 0.5, pids = 32 },
      prompt = "Use the supplied tools", timeZone = "Asia/Taipei",
    }
    local reply = run(function()
      local task = spawn_turn(rt, "fake:a", speaker, "hello")
      speaker.id, speaker.name, speaker.principalId = "owner", "Owner", "owner"
      local ok, res = async.wait(task)
      assert(ok, res)
      return res
    end)
    assert.same({ ok = true, text = "done" }, brief(reply))
    local call = driver.calls[1]
    local spec, uid, gid = call.spec, core.getuid()
    uid, gid = core.getuid()
    assert.equal(256, spec.memoryMb)
    assert.equal(0.5, spec.cpus)
    assert.equal(32, spec.pids)
    assert.equal(uid, spec.uid)
    assert.equal(gid, spec.gid)
    assert.equal("pi-roundtable-sandbox:test", spec.image)
    assert.equal('{"text":"hello","speaker":{"id":"guest","name":"Guest"},"model":"fake",'
      .. '"prompt":"Use the supplied tools","timeZone":"Asia/Taipei","reset":false,"tools":[],"mcp":[]}',
      call.encoded)
    assert.equal(root .. "/work/" .. core.sha256_hex("fake:a"), spec.workspaceDir)
    assert.truthy(spec.runDir:find("^" .. root:gsub("%p", "%%%0") .. "/run/turn%-%w%w%w%w%w%w$"))
    assert.truthy(spec.name:find("^roundtable%-sandbox%-" .. core.sha256_hex("fake:a"):sub(1, 16) .. "%-[0-9a-f]+$"))
    assert.equal(44, #spec.name)
    assert.equal(rt.installation, spec.labels["roundtable.sandbox.installation"])
    assert.equal(rt.owner, spec.labels["roundtable.sandbox.owner"])
    assert.equal(core.sha256_hex(root .. "/work\0" .. root .. "/run"), rt.installation)
    assert.truthy(rt.owner:find("^[%x%-]+:" .. core.getpid() .. ":%d+$"))
  end)

  it("R37: tool and MCP specs reach the turn without run, URL or key; parameters stay objects", function()
    local driver = fake.new(fake.reply(true, "ok"))
    new_runtime {
      driver = driver,
      tools = { { name = "clock", description = "time", parameters = {}, run = function() return "t" end } },
      mcp = { { name = "docs", url = "https://mcp.example/rpc", apiKey = function() return "mcp-key" end,
                tools = { { name = "search", description = "find", parameters = { type = "object" } } } } },
    }
    run(function() rt:run_turn("fake:a", GUEST, "hi") end)
    local encoded = driver.calls[1].encoded
    assert.truthy(encoded:find('"tools":[{"name":"clock","description":"time","parameters":{}}]', 1, true))
    assert.truthy(encoded:find('"mcp":[{"server":"docs","tools":[{"name":"search","description":"find","parameters":{"type":"object"}}]}]', 1, true))
    assert.falsy(encoded:find("mcp.example", 1, true))
    assert.falsy(encoded:find("mcp-key", 1, true))
    assert.falsy(encoded:find(KEY, 1, true))
  end)

  it("R27/B59: a forged identity body still reaches the tool as the bound channel and speaker; two channels, two workspaces", function()
    local seen = {}
    local tool = {
      name = "whoami", description = "who", parameters = {},
      run = function(input, ctx)
        seen[#seen + 1] = { input = input, speaker = ctx.speaker }
        return ctx.channel .. "/" .. ctx.speaker.id
      end,
    }
    local driver = fake.new(function(spec)
      local res = fake.post(spec, "/tools/whoami",
        '{"speaker":{"id":"owner","principalId":"owner"},"channel":"fake:private"}')
      assert.equal(200, res.status)
      return { ok = true, text = json.decode(res.body).text }
    end)
    new_runtime { driver = driver, tools = { tool } }
    local a, b = run(function()
      return rt:run_turn("fake:a", GUEST, "hi"), rt:run_turn("fake:b", GUEST, "hi")
    end)
    assert.same({ ok = true, text = "fake:a/guest" }, brief(a))
    assert.same({ ok = true, text = "fake:b/guest" }, brief(b))
    assert.equal("owner", seen[1].input.speaker.id)
    assert.same({ id = "guest", name = "Guest", principalId = "p_guest" }, seen[1].speaker)
    assert.are_not.equal(driver.calls[1].spec.workspaceDir, driver.calls[2].spec.workspaceDir)
    for _, call in ipairs(driver.calls) do
      assert.falsy(call.encoded:find(KEY, 1, true))
      assert.falsy(call.encoded:find("p_guest", 1, true))
    end
    assert.same({}, entries(root .. "/run"))
    assert.equal(2, #entries(root .. "/work"))
  end)

  it("R28/B79: neither the turn JSON nor the container spec holds the apiKey credential", function()
    local driver = fake.new(fake.reply(true, "ok"))
    new_runtime { driver = driver }
    run(function() rt:run_turn("fake:a", GUEST, "hello") end)
    local call = driver.calls[1]
    assert.falsy(call.encoded:find(KEY, 1, true))
    assert.falsy(json.encode(call.spec):find(KEY, 1, true))
    assert.falsy(json.encode(call.spec):find("models.example", 1, true))
  end)

  it("R29: two channels get different workspaces; the run root ends empty, the workspace root holds 2", function()
    local driver = fake.new(fake.reply(true, "ok"))
    new_runtime { driver = driver }
    run(function()
      rt:run_turn("fake:a", GUEST, "one")
      rt:run_turn("fake:b", GUEST, "two")
      rt:run_turn("fake:a", GUEST, "three")
    end)
    assert.are_not.equal(driver.calls[1].spec.workspaceDir, driver.calls[2].spec.workspaceDir)
    assert.equal(driver.calls[1].spec.workspaceDir, driver.calls[3].spec.workspaceDir)
    assert.same({}, entries(root .. "/run"))
    assert.equal(2, #entries(root .. "/work"))
    local st = core.fs_lstat(driver.calls[1].spec.workspaceDir)
    assert.equal("dir", st.type)
    assert.equal(tonumber("700", 8), st.mode)
  end)

  it("R30/B12: apiKey and tools get principalId; /model answers 200 over the 0600 socket in a 0700 turn dir", function()
    service_account()
    local up = fake_upstream.start()
    local scopes, tool_speakers = {}, {}
    local driver = fake.new(function(spec, turn)
      local dir = core.fs_stat(spec.runDir)
      local sock = core.fs_lstat(spec.runDir .. "/broker.sock")
      local model = fake.post(spec, "/model", '{"messages":[]}')
      local tool = fake.post(spec, "/tools/whoami", '{"speaker":{"id":"owner","principalId":"owner"}}')
      return { ok = true, text = table.concat({ dir.mode, sock.type, sock.mode, model.status, tool.status,
        json.encode(turn.speaker) }, " ") }
    end)
    local ok, err = pcall(function()
      new_runtime {
        driver = driver, allowHttp = true,
        modelUrl = up:url("/v1/chat/completions"),
        apiKey = function(scope) scopes[#scopes + 1] = scope; return KEY end,
        tools = { { name = "whoami", description = "who", parameters = {},
                    run = function(_, ctx) tool_speakers[#tool_speakers + 1] = ctx.speaker; return "x" end } },
      }
      local reply = run(function()
        up:reset()
        return rt:run_turn("fake:a", GUEST, "hi")
      end)
      assert.same({ ok = true, text = tonumber("700", 8) .. " socket " .. tonumber("600", 8)
        .. ' 200 200 {"id":"guest","name":"Guest"}' }, brief(reply))
      assert.equal(1, #scopes)
      assert.same({ channel = "fake:a", speaker = { id = "guest", name = "Guest", principalId = "p_guest" } }, scopes[1])
      assert.same({ { id = "guest", name = "Guest", principalId = "p_guest" } }, tool_speakers)
    end)
    up:stop()
    assert(ok, err)
  end)

  it("R31: a principal that is empty, 257 characters or missing is refused before the driver", function()
    local driver = fake.new(fake.reply(true, "ok"))
    new_runtime { driver = driver }
    run(function()
      for _, p in ipairs { "", string.rep("p", 257), false } do
        local ok, err = try_turn(rt, "fake:a", { id = "guest", name = "Guest", principalId = p or nil }, "hi")
        assert.is_false(ok)
        if p and #p == 257 then
          assert.equal("sandbox message too large", err)
        else
          assert.equal("a sandbox turn needs the principal its speaker was admitted as", err)
        end
      end
      local ok, err = try_turn(rt, "fake:a", "guest", "hi")
      assert.is_false(ok)
      assert.equal("a sandbox turn needs the principal its speaker was admitted as", err)
    end)
    assert.equal(0, #driver.calls)
    assert.same({}, entries(root .. "/run"))
  end)

  it("R32: refuses a bad channel key, 32,001 characters, bad speaker fields; 32,000 multi-byte characters pass", function()
    local driver = fake.new(fake.reply(true, "ok"))
    new_runtime { driver = driver }
    run(function()
      for _, key in ipairs { "Fake:a", "fake:", "fake", "fake:a\nb", "fake:\u{2028}", "fake:" .. string.rep("x", 252), "fake:\xff", 7 } do
        local ok, err = try_turn(rt, key, GUEST, "hi")
        assert.is_false(ok)
        assert.equal("invalid sandbox channel", err)
      end
      local ok, err = try_turn(rt, "fake:a", GUEST, string.rep("x", 32001))
      assert.is_false(ok)
      assert.equal("sandbox message too large", err)
      ok, err = try_turn(rt, "fake:a", { id = "", name = "G", principalId = "p" }, "hi")
      assert.equal("invalid sandbox message", err)
      ok, err = try_turn(rt, "fake:a", { id = "g", name = "\xff", principalId = "p" }, "hi")
      assert.equal("invalid sandbox message", err)
      ok, err = try_turn(rt, "fake:a", { id = "g", principalId = "p" }, "hi")
      assert.equal("invalid sandbox message", err)
      ok, err = try_turn(rt, "fake:a", GUEST, 5)
      assert.equal("invalid sandbox message", err)
      ok, err = try_turn(rt, "fake:a", { id = string.rep("i", 257), name = "G", principalId = "p" }, "hi")
      assert.equal("sandbox message too large", err)
      assert.equal(0, #driver.calls)
      local reply = rt:run_turn("fake:" .. string.rep("x", 251), GUEST, string.rep("é", 32000))
      assert.same({ ok = true, text = "ok" }, brief(reply))
    end)
    assert.equal(1, #driver.calls)
  end)

  it("R33: an encoded turn over 262,144 bytes is refused before the driver runs", function()
    local driver = fake.new(fake.reply(true, "ok"))
    new_runtime { driver = driver, prompt = string.rep("p", 262144) }
    local ok, err = run(function() return try_turn(rt, "fake:a", GUEST, "hi") end)
    assert.is_false(ok)
    assert.equal("sandbox message too large", err)
    assert.equal(0, #driver.calls)
    assert.same({}, entries(root .. "/run"))
  end)

  it("R34/B13: ok=false leaves nothing busy, an empty run root, the workspace intact and a new run dir next turn", function()
    local driver = fake.new(function(spec)
      local f = io.open(spec.workspaceDir .. "/note.txt", "a")
      f:write("kept\n")
      f:close()
      return { ok = false, text = "failed" }
    end)
    new_runtime { driver = driver }
    local r1, r2 = run(function()
      return rt:run_turn("fake:a", GUEST, "one"), rt:run_turn("fake:a", GUEST, "two")
    end)
    assert.same({ ok = false, text = "failed" }, brief(r1))
    assert.same({ ok = false, text = "failed" }, brief(r2))
    assert.same({}, rt:busy())
    assert.same({}, entries(root .. "/run"))
    local c1, c2 = driver.calls[1].spec, driver.calls[2].spec
    assert.equal(c1.workspaceDir, c2.workspaceDir)
    assert.are_not.equal(c1.runDir, c2.runDir)
    assert.equal("kept\nkept", sh("cat '" .. c1.workspaceDir .. "/note.txt'"))
  end)

  it("R35/B13: a driver raising 'driver failed' fails the turn (worker_failed), same cleanup and persistence", function()
    local driver = fake.new(function(spec)
      local f = io.open(spec.workspaceDir .. "/note.txt", "w")
      f:write("kept")
      f:close()
      error("driver failed", 0)
    end)
    new_runtime { driver = driver }
    run(function()
      for _ = 1, 2 do
        -- not a catalogue message: the reason is the host's worker_failed and
        -- the driver's text is never shown (it may quote a payload)
        local ok, res = try_turn(rt, "fake:a", GUEST, "hi")
        assert.equal("worker_failed", reason_of(ok, res))
        assert.is_nil(res.error)
        assert.equal("The sandbox turn failed or was stopped.", res.guest)
      end
    end)
    assert.same({}, rt:busy())
    assert.same({}, entries(root .. "/run"))
    assert.equal("kept", sh("cat '" .. driver.calls[1].spec.workspaceDir .. "/note.txt'"))
    assert.equal(driver.calls[1].spec.workspaceDir, driver.calls[2].spec.workspaceDir)
    assert.are_not.equal(driver.calls[1].spec.runDir, driver.calls[2].spec.runDir)
  end)

  it("R36/B15: a busy channel refuses a second turn; another channel runs at once; run root 2 then 0", function()
    local g = gate()
    local driver = fake.new(function() g.wait(); return { ok = true, text = "ok" } end)
    new_runtime { driver = driver }
    run(function()
      local ta = spawn_turn(rt, "fake:a", GUEST, "a")
      local tb = spawn_turn(rt, "fake:b", GUEST, "b")
      wait_for(function() return #driver.calls == 2 end, "both drivers")
      local ok, err = try_turn(rt, "fake:a", GUEST, "again")
      assert.is_false(ok)
      assert.truthy(err:find("channel is busy", 1, true))
      assert.equal("sandbox is stopped or channel is busy", err)
      assert.same({ "fake:a", "fake:b" }, rt:busy())
      assert.equal(2, #entries(root .. "/run"))
      g.release()
      local oka, ra = async.wait(ta)
      local okb, rb = async.wait(tb)
      assert.same({ true, { ok = true, text = "ok" } }, { oka, brief(ra) })
      assert.same({ true, { ok = true, text = "ok" } }, { okb, brief(rb) })
    end)
    assert.equal(2, #driver.calls)
    assert.same({}, rt:busy())
    assert.same({}, entries(root .. "/run"))
  end)

  it("R38/B17: a host tool still pending when the worker exits sees its signal abort; the turn returns Done.", function()
    local tool_signal, started = nil, false
    local driver = fake.new(function(spec)
      fake.post_and_leave(spec, "/tools/wait", "{}")
      wait_for(function() return started end, "the tool to start")
      return { ok = true, text = "Done." }
    end)
    new_runtime {
      driver = driver,
      tools = { { name = "wait", description = "waits", parameters = {}, run = function(_, ctx)
        tool_signal, started = ctx.signal, true
        fake.wait_abort(ctx.signal)
        return "late"
      end } },
    }
    local reply = run(function()
      local r = rt:run_turn("fake:a", GUEST, "hi")
      async.sleep(10)
      return r
    end)
    assert.same({ ok = true, text = "Done." }, brief(reply))
    assert.is_true(tool_signal.aborted)
    assert.same({}, entries(root .. "/run"))
  end)

  it("R39/B16: stop is false when idle and true when running; the driver's aborted reply is returned", function()
    local driver = fake.new(fake.until_abort("stopped"))
    new_runtime { driver = driver }
    run(function()
      assert.is_false(rt:stop("fake:a"))
      local t = spawn_turn(rt, "fake:a", GUEST, "hi")
      wait_for(function() return #driver.calls == 1 end, "the driver")
      assert.is_true(rt:stop("fake:a"))
      local ok, res = async.wait(t)
      assert.same({ true, { ok = false, text = "stopped" } }, { ok, brief(res) })
      assert.equal("stopped", res.reason)       -- the host saw the stop
      assert.equal("sandbox turn stopped", driver.calls[1].signal.reason)
    end)
    assert.same({}, rt:busy())
    assert.same({}, entries(root .. "/run"))
    assert.equal(1, #entries(root .. "/work"))
  end)

  it("R40/B16: after dispose run_turn is refused; dispose waits for active turns and is idempotent", function()
    local removed = false
    local driver = fake.new(function(_, _, sig)
      fake.wait_abort(sig)
      async.sleep(50)         -- the driver's container removal
      removed = true
      error(sig.reason, 0)
    end)
    new_runtime { driver = driver }
    run(function()
      local t = spawn_turn(rt, "fake:a", GUEST, "hi")
      wait_for(function() return #driver.calls == 1 end, "the driver")
      local second = async.spawn(function() rt:dispose() end)
      rt:dispose()
      assert.is_true(removed)
      assert.equal("stopped", reason_of(async.wait(t)))
      local sok, serr = async.wait(second)
      assert(sok, serr)
      rt:dispose()
      local ok, err = try_turn(rt, "fake:b", GUEST, "hi")
      assert.is_false(ok)
      assert.equal("sandbox is stopped or channel is busy", err)
    end)
    assert.same({}, rt:busy())
    assert.same({}, entries(root .. "/run"))
  end)

  it("R41: the deadline ends the turn with reason deadline ('sandbox turn timed out'); stop with stopped", function()
    local driver = fake.new(fake.raise_on_abort())
    new_runtime { driver = driver, turnTimeoutMs = 1000 }
    run(function()
      local started = core.now()
      local ok, res = try_turn(rt, "fake:a", GUEST, "hi")
      assert.equal("deadline", reason_of(ok, res))
      assert.equal("sandbox turn timed out", res.error)
      assert.is_true(core.now() - started >= 990)
      local t = spawn_turn(rt, "fake:a", GUEST, "hi")
      wait_for(function() return #driver.calls == 2 end, "the driver")
      rt:stop("fake:a")
      local sok, sres = async.wait(t)
      assert.equal("stopped", reason_of(sok, sres))
      assert.equal("sandbox turn stopped", sres.error)
    end)
    assert.same({}, entries(root .. "/run"))
  end)

  it("R41: a driver raising signal.AbortError surfaces the abort reason", function()
    local driver = fake.new(function(_, _, sig) fake.wait_abort(sig); sig:throw_if_aborted() end)
    new_runtime { driver = driver }
    run(function()
      local t = spawn_turn(rt, "fake:a", GUEST, "hi")
      wait_for(function() return #driver.calls == 1 end, "the driver")
      rt:stop("fake:a")
      assert.equal("stopped", reason_of(async.wait(t)))
    end)
  end)

  it("R42: a workspace path that is a symlink fails the turn", function()
    local driver = fake.new(fake.reply(true, "ok"))
    new_runtime { driver = driver }
    local target = root .. "/elsewhere"
    os.execute("mkdir -m 700 '" .. target .. "'")
    os.execute("ln -s '" .. target .. "' '" .. root .. "/work/" .. core.sha256_hex("fake:a") .. "'")
    local ok, err = run(function() return try_turn(rt, "fake:a", GUEST, "hi") end)
    assert.is_false(ok)
    assert.equal("sandbox workspace must be a service-owned directory", err)
    assert.equal(0, #driver.calls)
    assert.same({}, entries(root .. "/run"))
    -- a regular file in its place fails the same way
    local path = root .. "/work/" .. core.sha256_hex("fake:b")
    io.open(path, "w"):close()
    ok, err = run(function() return try_turn(rt, "fake:b", GUEST, "hi") end)
    assert.equal("sandbox workspace must be a service-owned directory", err)
  end)

  it("R58: guest texts: a failing turn shows the fixed text, ok=false its text; each logs its turn line", function()
    local n = 0
    local driver = fake.new(function()
      n = n + 1
      if n == 1 then error("secret detail " .. KEY, 0) end
      if n == 2 then return { ok = false, text = "The sandbox turn reached its model-call limit." } end
      return { ok = true, text = "Sealed." }
    end)
    local lines = {}
    local function keep(level) return function(msg, f) lines[#lines + 1] = { level, msg, f } end end
    new_runtime { driver = driver, logger = { info = keep("info"), warn = keep("warn"), error = keep("error") } }
    local texts = run(function()
      return { rt:guest_turn("fake:a", GUEST, "hi"), (rt:guest_turn("fake:a", GUEST, "hi")),
               (rt:guest_turn("fake:a", GUEST, "hi")) }
    end)
    assert.same({ "The sandbox turn failed or was stopped.", "The sandbox turn failed.", "Sealed." }, texts)
    -- operations.md 2 overrides 5.7's single line: one `turn finished` per
    -- turn, warn with its reason when it failed, info when it succeeded;
    -- never the driver's text (it held the key)
    local got = {}
    for _, l in ipairs(lines) do
      got[#got + 1] = { l[1], l[2], l[3].channel, l[3].reason }
      for _, v in pairs(l[3]) do assert.falsy(tostring(v):find(KEY, 1, true)) end
    end
    assert.same({ { "warn", "turn finished", "fake:a", "worker_failed" },
                  { "warn", "turn finished", "fake:a", "budget_exhausted" },
                  { "info", "turn finished", "fake:a", "ok" } }, got)
  end)

  it("B18: changing the caller's speaker table after admission does not change the broker's identity", function()
    local speaker = { id = "guest", name = "Guest", principalId = "p_guest" }
    local g = gate()
    local seen
    local driver = fake.new(function(spec)
      g.wait()
      local res = fake.post(spec, "/tools/whoami", "{}")
      return { ok = true, text = res.body }
    end)
    new_runtime {
      driver = driver,
      tools = { { name = "whoami", description = "who", parameters = {}, run = function(_, ctx)
        seen = ctx.speaker
        return "x"
      end } },
    }
    run(function()
      local t = spawn_turn(rt, "fake:a", speaker, "hi")
      speaker.id, speaker.name, speaker.principalId = "owner", "Owner", "owner"
      g.release()
      assert.is_true((async.wait(t)))
    end)
    assert.same({ id = "guest", name = "Guest", principalId = "p_guest" }, seen)
    assert.equal('{"id":"guest","name":"Guest"}', json.encode(driver.calls[1].turn.speaker))
  end)

  it("B13: a turn cancelled before the driver runs still removes its turn dir", function()
    local g = gate()
    local listed = false
    local driver = fake.new(fake.reply(true, "never"), {
      list = function() listed = true; g.wait(); return {} end,
      remove = function() end,
    })
    new_runtime { driver = driver }
    run(function()
      local t = spawn_turn(rt, "fake:a", GUEST, "hi")
      wait_for(function() return listed end, "the sweep")
      assert.is_true(rt:stop("fake:a"))
      assert.equal("stopped", reason_of(async.wait(t)))
      g.release()
    end)
    assert.equal(0, #driver.calls)
    assert.same({}, entries(root .. "/run"))
  end)

  it("sweeps stale containers and leftover turn dirs before the first container starts", function()
    local removed, order = {}, {}
    local stale = "roundtable-sandbox-0123456789abcdef-01234567"
    local mine = "roundtable-sandbox-0123456789abcdef-89abcdef"
    local driver
    driver = fake.new(function() order[#order + 1] = "run"; return { ok = true, text = "ok" } end, {
      list = function(_, installation)
        order[#order + 1] = "list"
        return {
          { name = stale, owner = "gone:1:1" },
          { name = mine, owner = driver.owner_for_spec },
          { name = "someone-else", owner = "gone:1:1" },
        }
      end,
      remove = function(_, name) removed[#removed + 1] = name end,
    })
    service_account()
    root = tmproot()
    os.execute("mkdir -m 700 '" .. root .. "/run' && mkdir -p '" .. root .. "/run/turn-abc123/x' '" .. root .. "/run/keep-me'")
    driver.owner_for_spec = require("sandbox.runtime._installation").owner_id()
    rt = runtime.new(options_for(root, { driver = driver }))
    local reply = run(function() return rt:run_turn("fake:a", GUEST, "hi") end)
    assert.same({ ok = true, text = "ok" }, brief(reply))
    assert.same({ stale }, removed)
    assert.same({ "list", "run" }, order)
    assert.same({ "keep-me" }, entries(root .. "/run"))
    assert.equal(1, run(function() return rt:sweep() end))   -- the fake lists it again
  end)

  it("a sweep that fails because the daemon does not answer is daemon_unavailable, with no cleanup line or count", function()
    local driver = fake.new(fake.reply(true, "ok"), {
      list = function() error("Cannot connect to the Docker daemon", 0) end,
      remove = function() end,
      inspect_daemon = function() return nil, "not found" end,
    })
    local lines = {}
    local function keep(level) return function(msg) lines[#lines + 1] = level .. ":" .. tostring(msg) end end
    new_runtime { driver = driver, logger = { debug = keep "debug", info = keep "info", warn = keep "warn", error = keep "error" } }
    run(function()
      local ok, res = try_turn(rt, "fake:a", GUEST, "hi")
      assert.equal("daemon_unavailable", reason_of(ok, res))
      assert.equal("the Docker daemon did not answer", res.error)
      local ok2, err = pcall(rt.sweep, rt)
      assert.is_false(ok2)
      assert.equal("the Docker daemon did not answer", err)
    end)
    for _, l in ipairs(lines) do assert.is_nil(l:find("could not be removed", 1, true), l) end
  end)

  it("a failed sweep is retried by the next turn; a second failure fails it with the cleanup error", function()
    local fails = 2
    local driver = fake.new(fake.reply(true, "ok"), {
      list = function()
        if fails > 0 then fails = fails - 1; error("daemon down", 0) end
        return {}
      end,
      remove = function() end,
    })
    new_runtime { driver = driver }
    run(function()
      local ok, res = try_turn(rt, "fake:a", GUEST, "hi")
      assert.equal("cleanup_failed", reason_of(ok, res))
      assert.equal("sandbox container cleanup failed; inspect this installation's containers", res.error)
      assert.same({ ok = true, text = "ok" }, brief(rt:run_turn("fake:a", GUEST, "hi")))
    end)
    assert.equal(1, #driver.calls)
  end)
end)

---------------------------------------------------------------------------
describe("the per-channel FIFO in front of the runtime (spec/runtime.md 5.1)", function()
  local turn_queue = require "sandbox.channels._queue"

  it("runs one channel's messages in order without hitting 'channel is busy'; channels run in parallel", function()
    service_account()
    local root = tmproot()
    local g = gate()
    local order = {}
    local driver = fake.new(function(_, turn)
      g.wait()
      order[#order + 1] = turn.text
      return { ok = true, text = turn.text }
    end)
    local rt = runtime.new(options_for(root, { driver = driver }))
    local q = turn_queue.new()
    run(function()
      local tasks = {}
      for i, m in ipairs { { "fake:a", "a1" }, { "fake:a", "a2" }, { "fake:b", "b1" }, { "fake:a", "a3" } } do
        tasks[i] = q:enqueue(m[1], rt.run_turn, rt, m[1], GUEST, m[2])
      end
      wait_for(function() return #driver.calls == 2 end, "one turn per channel")
      assert.same({ "fake:a", "fake:b" }, rt:busy())
      assert.equal(3, q:size("fake:a"))
      g.release()
      for i, want in ipairs { "a1", "a2", "b1", "a3" } do
        local ok, reply = async.wait(tasks[i])
        assert(ok, reply)
        assert.equal(want, reply.text)
      end
      assert.equal("b1", q:run("fake:b", function() return "b1" end))
      rt:dispose()
    end)
    local a_order = {}
    for _, t in ipairs(order) do
      if t:sub(1, 1) == "a" then a_order[#a_order + 1] = t end
    end
    assert.same({ "a1", "a2", "a3" }, a_order)
    assert.equal(4, #order)
    assert.equal(0, q:size("fake:a"))
  end)

  it("a failing job does not stop the jobs behind it", function()
    local q = turn_queue.new()
    run(function()
      local t1 = q:enqueue("fake:a", function() async.sleep(5); error("first failed", 0) end)
      local t2 = q:enqueue("fake:a", function() return "second" end)
      assert.same({ false, "first failed" }, { async.wait(t1) })
      assert.same({ true, "second" }, { async.wait(t2) })
      assert.has_error(function() q:run("fake:a", error, "boom", 0) end, "boom")
    end)
  end)
end)

---------------------------------------------------------------------------
describe("the runtime with the built-in CLI driver and a fake docker binary", function()
  it("sweeps, runs one turn with the turn on stdin and the reply from stdout, removes the container once", function()
    service_account()
    local cli = require "sandbox.drivers.cli"
    local root = tmproot()
    local bin = root .. "/docker"
    local f = assert(io.open(bin, "w"))
    f:write(([[#!/bin/sh
echo "$1" >> %s/calls
case "$1" in
  run) cat > %s/stdin; printf '{"ok":true,"text":"Done."}' ;;
  rm) exit 0 ;;
  ps) exit 0 ;;
  *) exit 2 ;;
esac
]]):format(root, root))
    f:close()
    os.execute("chmod 700 '" .. bin .. "'")
    local rt = runtime.new(options_for(root, { driver = cli { binary = bin }, prompt = "P" }))
    local reply = run(function()
      local r = rt:run_turn("fake:a", GUEST, "hello")
      rt:dispose()
      return r
    end)
    assert.same({ ok = true, text = "Done." }, brief(reply))
    assert.equal("ps\nrun\nrm", sh("cat '" .. root .. "/calls'"))
    assert.equal('{"text":"hello","speaker":{"id":"guest","name":"Guest"},"model":"fake","prompt":"P",'
      .. '"timeZone":"UTC","reset":false,"tools":[],"mcp":[]}', sh("cat '" .. root .. "/stdin'"))
    assert.same({}, entries(root .. "/run"))
  end)
end)

---------------------------------------------------------------------------
describe("startFresh (spec/runtime.md 7.4)", function()
  local root, rt

  local function resets(driver)
    local out = {}
    for i, c in ipairs(driver.calls) do out[i] = c.turn.reset end
    return out
  end

  after_each(function()
    if rt then dispose(rt) end
    rt = nil
  end)

  local function setup_runtime(behaviour)
    service_account()
    root = tmproot()
    local driver = fake.new(behaviour)
    rt = runtime.new(options_for(root, { driver = driver }))
    return driver
  end

  -- A driver behaviour whose first call runs first() (what it returns, if
  -- anything, is that call's reply); every call after it answers "ok".
  local function first_then_ok(first)
    local n = 0
    return function()
      n = n + 1
      if n == 1 then
        local reply = first()
        if reply then return reply end
      end
      return { ok = true, text = "ok" }
    end
  end

  local function start_fresh_a() rt:start_fresh("fake:a") end

  -- Three turns on fake:a; the reset flag of each driver call.
  local function three_turns(driver)
    run(function()
      for _ = 1, 3 do rt:run_turn("fake:a", GUEST, "hi") end
    end)
    return resets(driver)
  end

  it("R43: start-fresh during an active turn survives it: [false, true, false]", function()
    local driver = setup_runtime(first_then_ok(start_fresh_a))
    assert.same({ false, true, false }, three_turns(driver))
  end)

  it("R43: with a reset already pending: [true, true, false]", function()
    local driver = setup_runtime(first_then_ok(start_fresh_a))
    rt:start_fresh("fake:a")
    assert.same({ true, true, false }, three_turns(driver))
  end)

  it("R44: start-fresh right after run_turn is called, before the driver runs, applies to the next turn: [false, true]", function()
    local driver = setup_runtime(fake.reply(true, "ok"))
    run(function()
      local t = spawn_turn(rt, "fake:a", GUEST, "hi")
      rt:start_fresh("fake:a")
      assert.is_true((async.wait(t)))
      rt:run_turn("fake:a", GUEST, "hi")
    end)
    assert.same({ false, true }, resets(driver))
  end)

  it("R45/B14: a failing turn keeps the reset: [true, true, false]", function()
    local driver = setup_runtime(first_then_ok(function() return { ok = false, text = "failed" } end))
    rt:start_fresh("fake:a")
    assert.same({ true, true, false }, three_turns(driver))
  end)

  it("R45/B14: a raising driver (worker_failed) keeps the reset too", function()
    local driver = setup_runtime(first_then_ok(function() error("driver failed", 0) end))
    rt:start_fresh("fake:a")
    run(function()
      assert.equal("worker_failed", reason_of(try_turn(rt, "fake:a", GUEST, "hi")))
      rt:run_turn("fake:a", GUEST, "hi")
      rt:run_turn("fake:a", GUEST, "hi")
    end)
    assert.same({ true, true, false }, resets(driver))
  end)

  it("start-fresh on another channel does not reset this one; a bad key is refused", function()
    local driver = setup_runtime(fake.reply(true, "ok"))
    rt:start_fresh("fake:b")
    run(function() rt:run_turn("fake:a", GUEST, "hi") end)
    assert.same({ false }, resets(driver))
    assert.has_error(function() rt:start_fresh("Bad") end, "invalid sandbox channel")
  end)
end)
