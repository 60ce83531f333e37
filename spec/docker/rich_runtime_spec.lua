-- docker/rich_runtime_spec.lua: sandbox.rich end to end on the real daemon
-- (spec/rich-mode.md behaviours 129-131) with the built-in Docker driver,
-- through both drivers of the contract (the Engine API over the socket, the
-- default; the docker CLI, drivers/cli.lua), and the images `make image-pi`
-- builds: the two drivers make the same container; the container posts ready; a turn against the scripted Anthropic upstream
-- (reached through fetchImpl) completes while only the broker ever holds the
-- real token; a worker whose PID 1 ignores SIGTERM is force-removed at the
-- turn deadline. Opt-in with SANDBOX_DOCKER_TEST=1 (make check sets it); runs
-- as the sbx account. Containers are named <containerPrefix>-<segment> of a
-- test-only channel ("spec:rich-l-<pid>-<n>") and removed afterwards; the
-- SIGTERM test's derived image is roundtable-rich-l-test-sigterm:<pid>.
local async = require "sandbox.async"
local core = require "sandbox.core"
local drivers = require "sandbox.drivers"
local json = require "sandbox.json"
local rich = require "sandbox.rich"
local spec_fs = require "spec_fs"
local upstream = require "anthropic_upstream"

local ENABLED = os.getenv("SANDBOX_DOCKER_TEST") == "1"
local IMAGE = os.getenv("PI_IMAGE") or "pi-roundtable-sandbox:pi"
local DEPS = os.getenv("PI_DEPS_IMAGE") or "pi-roundtable-sandbox:pi-deps"
local SECRET = "sk-ant-oat01-rich-l-host-only-secret-4242"
local PID = spec_fs.sh("echo $PPID")

local q = spec_fs.q
local function sh(cmd) return spec_fs.run(cmd .. " 2>&1") end

if not ENABLED then
  describe("rich mode on real Docker", function()
    pending("set SANDBOX_DOCKER_TEST=1 to run the rich real-Docker spec (make check does)")
  end)
  return
end
-- The docker-runsc pass (docker_runtime.lua): rich mode's driver has no
-- `runtime` option (warm-turns.md 2 gives it to the sealed runtime only), so
-- its containers would run under the default runtime again: said, not rerun.
if require("docker_runtime").name then
  describe("rich mode on real Docker", function()
    pending("SBX_RUNTIME=" .. require("docker_runtime").name .. ": rich mode takes no runtime option "
      .. "(its containers always use the daemon's default; the first docker pass covered them)")
  end)
  return
end

describe("rich mode on real Docker (129-131)", function()
  local up, dirs, names, images, seq = nil, {}, {}, {}, 0

  setup(function()
    assert.equal(0, select(2, sh("docker image inspect " .. q(IMAGE) .. " " .. q(DEPS) .. " >/dev/null")),
      "the rich images are missing: run `make image-pi`")
    up = upstream.start()
  end)

  teardown(function()
    for _, n in ipairs(names) do sh("docker rm -f " .. q(n)) end
    for _, i in ipairs(images) do sh("docker rmi -f " .. q(i)) end
    if up then up:stop() end
    spec_fs.rmdirs(dirs)
  end)

  local function channel()
    seq = seq + 1
    return "spec:rich-l-" .. PID .. "-" .. seq
  end

  -- rich mode's driver through one of the contract's two Docker drivers
  local function driver_via(via)
    if via == "cli" then return rich.dockerDriver { driver = drivers.cli {}, log = { driver = "local" } } end
    return rich.dockerDriver { log = { driver = "local" } }
  end

  local function runtime(image, over)
    local logs = {}
    local curl = rich.transport()
    local o = {
      partyDir = spec_fs.tmpdir("rd", dirs, "/tmp") .. "/p", image = image,
      profiles = { spec = { model = "claude-sonnet-4-6" } },
      oauthToken = function() return SECRET end,
      effort = { judge = function() return "low" end },
      driver = rich.dockerDriver { log = { driver = "local" } },
      fetchImpl = function(req)
        local url = req.url:gsub("^https://api%.anthropic%.com", up.url)
        return curl { method = req.method, url = url, headers = req.headers, body = req.body, signal = req.signal }
      end,
      logger = { info = function(m, f) logs[#logs + 1] = { msg = m, fields = f } end,
        warn = function(m, f) logs[#logs + 1] = { msg = m, fields = f } end,
        error = function(m, f) logs[#logs + 1] = { msg = m, fields = f } end },
      startTimeoutMs = 120000, turnTimeoutMs = 180000,
    }
    for k, v in pairs(over or {}) do o[k] = v end
    return rich(o), logs
  end

  local function files_under(dir)
    local out = {}
    for line in sh("find " .. q(dir) .. " -type f"):gmatch("[^\n]+") do out[#out + 1] = line end
    return out
  end

  it("the CLI and the Engine API driver create the same container: every 5.3 setting read back from the daemon", function()
    local dir = spec_fs.tmpdir("rd-same", dirs, "/tmp")
    os.execute("mkdir -p " .. q(dir .. "/run") .. " " .. q(dir .. "/ws"))
    local seen = {}
    for _, via in ipairs { "engine", "cli" } do
      local name = "roundtable-rich-l-same-" .. PID .. "-" .. via
      names[#names + 1] = name
      local d = driver_via(via)
      async.run(function()
        d.ensureRunning { name = name, image = IMAGE, channel = "spec:same \u{e9}", profile = "spec", timeZone = "UTC",
          labelChannel = "roundtable.sandbox.channel", labelProfile = "roundtable.sandbox.profile",
          runDir = dir .. "/run", workspaceDir = dir .. "/ws", uid = 1000, gid = 1000 }
        local st = d.status(name)   -- no broker listens: the worker may be between restarts
        assert.same({ image = IMAGE, profile = "spec" }, { image = st.image, profile = st.profile })
        assert.is_truthy(st.state == "running" or st.state == "stopped", st.state)
      end)
      local v = json.plain(json.decode((sh("docker inspect " .. q(name)))))[1]
      local h, c = v.HostConfig, v.Config
      seen[via] = {
        Image = c.Image, User = c.User, Env = c.Env, Labels = c.Labels,
        NetworkMode = h.NetworkMode, ReadonlyRootfs = h.ReadonlyRootfs, Tmpfs = h.Tmpfs, Memory = h.Memory,
        MemorySwap = h.MemorySwap, NanoCpus = h.NanoCpus, PidsLimit = h.PidsLimit, Ulimits = h.Ulimits,
        CapDrop = h.CapDrop, SecurityOpt = h.SecurityOpt, Binds = h.Binds, RestartPolicy = h.RestartPolicy,
        LogConfig = h.LogConfig, Privileged = h.Privileged, Mounts = h.Mounts, CapAdd = h.CapAdd,
      }
      async.run(function()
        d.remove(name)
        assert.same({ state = "missing" }, d.status(name))
      end)
    end
    assert.equal(1536 * 1024 * 1024, seen.engine.Memory)
    assert.equal(1000000000, seen.engine.NanoCpus)
    assert.equal(256, seen.engine.PidsLimit)
    assert.same({ Name = "unless-stopped", MaximumRetryCount = 0 }, seen.engine.RestartPolicy)
    assert.same(seen.engine, seen.cli)
  end)

  for _, via in ipairs { "engine", "cli" } do
  it("B129/B130 (" .. via .. " driver): the worker posts ready; a turn completes and only the broker ever sees the real token", function()
    local rt = runtime(IMAGE, { driver = driver_via(via) })
    local ch = channel()
    local name = "roundtable-sandbox-" .. rich.channelSegment(ch)
    names[#names + 1] = name
    local r
    async.run(function()
      up:reset()
      up:push { upstream.sse_text("Hello from the rich container") }
      rt:start(ch, "spec")
      assert.is_true(rt:broker(ch).ready)
      assert.equal("running", rt:status(ch).state)
      r = rt:runTurn { channel = ch, profile = "spec", turnId = "t1", author = { id = "123", name = "Ann", principalId = "ann" },
        text = "hello there", images = {} }
      assert.is_true(r.ok, r.error)
      local calls = up:messages()
      assert.is_true(#calls >= 1)
      for _, c in ipairs(calls) do assert.equal("Bearer " .. SECRET, c.headers.authorization) end
      assert.matches("[Ann (123)] hello there", json.encode(json.jsonable(calls[#calls].body)), 1, true)
      rt:stopBrokers()
    end)
    assert.equal("Hello from the rich container", r.text)
    local inspect = json.plain(json.decode((sh("docker inspect " .. q(name)))))[1]
    local env = json.encode(json.jsonable(inspect.Config.Env))
    assert.is_nil(env:find(SECRET, 1, true))
    assert.matches("CLAUDE_CODE_OAUTH_TOKEN=sandbox-dummy-token", env, 1, true)
    assert.equal("none", inspect.HostConfig.NetworkMode)
    assert.is_true(inspect.HostConfig.ReadonlyRootfs)
    local ws = rt:sessionsDir(ch):gsub("/sessions$", "")
    for _, f in ipairs(files_under(ws)) do
      local st = core.fs_lstat(f)
      if st and st.size < 64 * 1024 * 1024 then
        assert.is_nil((spec_fs.read(f) or ""):find(SECRET, 1, true), f)
      end
    end
    local logs = sh("docker logs " .. q(name))
    assert.is_nil(logs:find(SECRET, 1, true))
    assert.matches("turn finished", logs, 1, true)
    async.run(function() rt:stop(ch) end)
    assert.equal("missing", (function() local s async.run(function() s = rt:status(ch) end) return s.state end)())
  end)
  end

  it("a profile with an MCP server: pi-mcp-adapter connects through the startup scope and its tool reaches the model", function()
    local mcp = require("mcp_server").start { require_key = "mcp-host-key" }
    local rt = runtime(IMAGE, {
      profiles = { spec = { model = "claude-sonnet-4-6", mcp = { "docs" } } }, allowHttpMcp = true,
      mcp = { servers = { { name = "docs", url = mcp.url, tools = { "search" } } }, token = function() return "mcp-host-key" end },
    })
    local ch = channel()
    names[#names + 1] = "roundtable-sandbox-" .. rich.channelSegment(ch)
    local ok, err = pcall(async.run, function()
      up:reset()
      rt:start(ch, "spec")
      local r = rt:runTurn { channel = ch, profile = "spec", turnId = "t1", author = { id = "1", name = "A" }, text = "hi", images = {} }
      assert.is_true(r.ok, r.error)
      local m = up:messages()
      local tools = {}
      for _, t in ipairs(m[#m].body.tools or {}) do tools[t.name] = true end
      assert.is_true(tools["mcp__custom-tools__docs_search"])
      local methods = {}
      for _, e in ipairs(mcp:log()) do
        methods[e.body.method] = true
        assert.equal("Bearer mcp-host-key", e.authorization)
      end
      assert.is_true(methods.initialize and methods["tools/list"] and methods["notifications/initialized"])
      assert.is_nil(methods["tools/call"])
      rt:stop(ch)
    end)
    mcp:stop()
    assert.is_true(ok, err)
  end)

  it("B99/B101/B108/B31: a private host result for Ann, then Bo refused on the bridge, then a reply file, through a real container", function()
    local image = "roundtable-rich2-test-private:" .. PID
    local ctx = spec_fs.tmpdir("rd-img", dirs, "/tmp")
    -- The image's content with two host tools: recall (private) and draw (an image, so a reply file).
    spec_fs.write(ctx .. "/content.ts", [[
export function workerContent() {
  return {
    model: { provider: "claude-bridge", id: "claude-sonnet-4-6" },
    prompt: "Spec persona.",
    brokerTools: [
      { name: "recall", description: "Recall a private note", parameters: { type: "object", properties: {} } },
      { name: "draw", description: "Draw a picture", parameters: { type: "object", properties: {} } },
    ],
  };
}
]])
    spec_fs.write(ctx .. "/Dockerfile", "FROM " .. IMAGE .. "\nCOPY content.ts /app/worker/content.ts\n")
    os.execute("chmod -R a+rX " .. q(ctx))
    local out, code = sh("DOCKER_BUILDKIT=0 docker build -q -t " .. q(image) .. " " .. q(ctx))
    images[#images + 1] = image
    assert.equal(0, code, out)
    local PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    local seen_tools = {}
    local rt = runtime(image, { tools = { names = { "recall", "draw" }, call = function(name, _, c)
      seen_tools[#seen_tools + 1] = name
      if name == "recall" then return { ok = true, text = "Ann's locker code is 7314", privateTo = c.speaker.principalId } end
      return { ok = true, text = "drawn", image = { data = PNG, mimeType = "image/png" } }
    end } })
    local ch = channel()
    names[#names + 1] = "roundtable-sandbox-" .. rich.channelSegment(ch)
    local ann = { id = "1", name = "Ann", principalId = "ann" }
    local r1, r2, r3, calls_after_ann
    async.run(function()
      up:reset()
      up:push { upstream.sse_tool("mcp__custom-tools__recall", {}), upstream.sse_text("I found your note."),
        upstream.sse_tool("mcp__custom-tools__draw", {}, "toolu_spec_2"), upstream.sse_text("Here is your picture.") }
      rt:start(ch, "spec")
      r1 = rt:runTurn { channel = ch, profile = "spec", turnId = "t1", author = ann, text = "what is my code?", images = {} }
      calls_after_ann = #up:messages()
      r2 = rt:runTurn { channel = ch, profile = "spec", turnId = "t2", author = { id = "2", name = "Bo", principalId = "bo" },
        text = "what did Ann ask?", images = {} }
      assert.equal(calls_after_ann, #up:messages())            -- Bo's turn called no provider
      r3 = rt:runTurn { channel = ch, profile = "spec", turnId = "t3", author = ann, text = "draw me", images = {} }
      assert.is_true(rt:broker(ch).requirement)
      rt:stop(ch)
    end)
    assert.is_true(r1.ok, r1.error)
    assert.equal("I found your note.", r1.text)
    assert.is_false(r2.ok)
    assert.matches("claude-bridge cannot replay another reader's private-memory turns or private exchanges", r2.error, 1, true)
    assert.is_true(r3.ok, r3.error)
    assert.equal("Here is your picture.", r3.text)
    assert.equal(1, #r3.files)
    assert.equal("image.png", r3.files[1].name)
    assert.equal(core.base64_decode(PNG), r3.files[1].data)
    assert.same({ "recall", "draw" }, seen_tools)
  end)

  for _, via in ipairs { "engine", "cli" } do
  it("B131 (" .. via .. " driver): a container whose PID 1 ignores SIGTERM is force-removed at the turn deadline", function()
    local image = "roundtable-rich-l-test-sigterm:" .. PID .. "-" .. via
    local ctx = spec_fs.tmpdir("rd-img", dirs, "/tmp")
    -- preloaded, so the worker itself stays the main module
    spec_fs.write(ctx .. "/sigterm.js", 'process.on("SIGTERM", () => {});\n')
    spec_fs.write(ctx .. "/Dockerfile", "FROM " .. IMAGE .. "\nCOPY sigterm.js /app/test/sigterm.js\n"
      .. 'ENTRYPOINT ["/usr/local/bin/bun", "--preload", "/app/test/sigterm.js", "/app/worker/pi-main.js"]\n')
    os.execute("chmod -R a+rX " .. q(ctx))
    local out, code = sh("DOCKER_BUILDKIT=0 docker build -q -t " .. q(image) .. " " .. q(ctx))
    images[#images + 1] = image
    assert.equal(0, code, out)
    local rt, logs = runtime(image, { turnTimeoutMs = 30000, driver = driver_via(via) })
    local ch = channel()
    local name = "roundtable-sandbox-" .. rich.channelSegment(ch)
    names[#names + 1] = name
    local r
    async.run(function()
      up:reset()
      up:push { { hang = true } }
      rt:start(ch, "spec")
      assert.equal(0, select(2, sh("docker kill --signal TERM " .. q(name))))
      r = rt:runTurn { channel = ch, profile = "spec", turnId = "t1", author = { id = "1", name = "Bo" }, text = "wait", images = {} }
      -- the worker outlived SIGTERM: it called the model, which never answered
      assert.is_true(#up:messages() >= 1)
      assert.equal("missing", rt:status(ch).state)
      rt:stopBrokers()
    end)
    assert.same({ ok = false, error = "Sandbox turn timed out" }, { ok = r.ok, error = r.error })
    local seen
    for _, l in ipairs(logs) do if l.msg == "sandbox worker log before removal" then seen = l.fields end end
    assert.is_table(seen)
    assert.matches("sandbox worker ready", seen.lines, 1, true)
  end)
  end

  it("issue 26: a 529 five times ends the turn after the host's three tries with no provider text; the next turn reuses the container", function()
    local rt, logs = runtime(IMAGE)
    local ch = channel()
    local name = "roundtable-sandbox-" .. rich.channelSegment(ch)
    names[#names + 1] = name
    local over = { json = { type = "error", error = { type = "overloaded_error", message = "Overloaded: provider secret text" } },
      status = 529, headers = { ["retry-after"] = "0" } }
    local r1, r2, tries
    async.run(function()
      up:reset()
      rt:start(ch, "spec")
      up:push { over, over, over, over, over }
      r1 = rt:runTurn { channel = ch, profile = "spec", turnId = "t-529", author = { id = "123", name = "Ann", principalId = "ann" },
        text = "hello", images = {} }
      tries = #up:messages()
      up:reset()
      up:push { upstream.sse_text("after the outage") }
      r2 = rt:runTurn { channel = ch, profile = "spec", turnId = "t-next", author = { id = "123", name = "Ann", principalId = "ann" },
        text = "again", images = {} }
      rt:stopBrokers()
    end)
    assert.is_false(r1.ok)
    assert.is_nil(json.encode(json.jsonable(r1)):find("provider secret", 1, true))
    assert.is_nil(json.encode(json.jsonable(r1)):find("verloaded", 1, true))
    assert.equal(3, tries)          -- the host's 1 + upstreamRetries (2); the worker did not retry
    assert.is_true(r2.ok, r2.error)
    assert.equal("after the outage", r2.text)
    local removed = 0
    for _, l in ipairs(logs) do if l.msg == "sandbox worker log before removal" then removed = removed + 1 end end
    assert.equal(0, removed)
    async.run(function() rt:stop(ch) end)
  end)

  it("issue 26: an expired-token 401 and a mid-stream overloaded_error event each end a real turn at once, with no provider text", function()
    local rt, logs = runtime(IMAGE)
    local ch = channel()
    names[#names + 1] = "roundtable-sandbox-" .. rich.channelSegment(ch)
    local head = upstream.sse_text("half").events
    local mid = { chunks = { upstream.sse({ head[1] }),
      'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded: provider secret text"}}\n\n' } }
    local results, calls = {}, {}
    async.run(function()
      up:reset()
      rt:start(ch, "spec")
      for i, reply in ipairs {
        { json = { type = "error", error = { type = "authentication_error", message = "OAuth token has expired: provider secret text" } },
          status = 401, headers = { ["request-id"] = "req_expired" } },
        mid,
      } do
        up:reset()
        up:push { reply }
        results[i] = rt:runTurn { channel = ch, profile = "spec", turnId = "t-f" .. i,
          author = { id = "123", name = "Ann", principalId = "ann" }, text = "hello", images = {} }
        calls[i] = #up:messages()
      end
      rt:stopBrokers()
    end)
    for i, r in ipairs(results) do
      assert.is_false(r.ok, i .. " " .. json.encode(json.jsonable(r)))
      assert.is_nil(json.encode(json.jsonable(r)):find("provider secret", 1, true))
    end
    assert.equal(1, calls[1])          -- the 401: one call, the worker gave up at once
    assert.is_true(calls[2] <= 2)      -- the mid-stream event: Pi makes at most one more call (not 7-8)
    local line
    for _, l in ipairs(logs) do
      if l.msg == "sandbox upstream call failed" and l.fields.status == 401 then line = l.fields end
    end
    assert.same({ "authentication_error", "req_expired" }, { line.type, line.request_id })
    assert.matches("oauthToken", line.fix, 1, true)
    async.run(function() rt:stop(ch) end)
  end)
end)
