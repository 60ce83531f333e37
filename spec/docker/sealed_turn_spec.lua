-- docker/sealed_turn_spec.lua: what a sealed turn guarantees on the real
-- daemon, beyond the scripted integration of integration_spec.lua:
--   * a worker that tries the network, writes outside its workspace, forks
--     past the PID limit or allocates past the memory limit fails (or is
--     contained in) only its own turn;
--   * two channels run turns at the same time;
--   * memory and history survive between turns and stay in their channel.
-- The misbehaving workers are FROM-scratch images of
-- spec/fixtures/hostile/probe.c, chosen per turn by a driver wrapper (a
-- trusted seam) from the message text; the well-behaved turns run the real
-- worker built from this tree as sbx-sealed-spec-worker:<tag> (or
-- SBX_TEST_IMAGE). Opt-in with SANDBOX_DOCKER_TEST=1.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local probe_images = require "probe_images"
local D = require "docker_runtime"
local sandbox = require "sandbox"
local spec_fs = require "spec_fs"

local ENABLED = os.getenv("SANDBOX_DOCKER_TEST") == "1"
local IMAGE                  -- the real worker's image (setup)
local KEY = "sealed-spec-key"
local TAG = core.random_hex(4)
local MODES = { "net", "write", "fork", "oom" }
local SPEAKER = { id = "guest", name = "Guest", principalId = "p_guest" }

local q = spec_fs.q
-- Output (stderr too) and exit code.
local function sh(cmd) return spec_fs.run(cmd .. " 2>&1") end

if not ENABLED then
  describe("sealed turn guarantees on real Docker", function()
    pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker specs (make check does)")
  end)
  return
end

describe("sealed turn guarantees on real Docker", function()
  local root, server, rt
  local images = {}
  local in_flight, max_in_flight, delay_ms = 0, 0, 0

  -- The scripted model: REMEMBER:<fact> asks for memory_set and then confirms;
  -- RECALL answers whether the system message holds the fact and whether an
  -- earlier user message of the history holds the REMEMBER request.
  local function answer(body)
    local msgs = body.messages
    local last_user, system, earlier_users = "", "", {}
    for i, m in ipairs(msgs) do
      if m.role == "system" then system = system .. m.content end
      if m.role == "user" then
        if last_user ~= "" then earlier_users[#earlier_users + 1] = last_user end
        last_user = m.content
      end
      if m.role == "tool" and i == #msgs then return { content = "saved" } end
    end
    local fact = last_user:match("REMEMBER:(%w+%-fact)")
    if fact then
      local args = json.encode(json.object({ "scope", "key", "text" }, { scope = "channel", key = "fact", text = fact }))
      return { tool_calls = json.array { json.object({ "id", "type", "function" }, {
        id = "call_mem", type = "function",
        ["function"] = json.object({ "name", "arguments" }, { name = "memory_set", arguments = args }) }) } }
    end
    local in_history = false
    for _, u in ipairs(earlier_users) do if u:find("REMEMBER:alpha-fact", 1, true) then in_history = true end end
    return { content = string.format("system:%s history:%s", system:find("alpha-fact", 1, true) and "yes" or "no",
      in_history and "yes" or "no") }
  end

  setup(function()
    root = spec_fs.tmpdir("sb-sealed")
    local own
    IMAGE, own = probe_images.worker(root, "sbx-sealed-spec-worker:" .. TAG)
    images = probe_images.build(root, "spec/fixtures/hostile/probe.c", MODES,
      function(mode) return "sbx-sealed-spec-" .. mode .. ":" .. TAG end)
    for _, name in ipairs(own) do images.worker = name end
    server = assert(core.http_server {
      on_request = function(req)
        in_flight = in_flight + 1
        max_in_flight = math.max(max_in_flight, in_flight)
        local body = json.decode(req.body or "")
        local function respond()
          in_flight = in_flight - 1
          if req.headers.authorization ~= "Bearer " .. KEY or not body then return req:reply(401, "{}") end
          local msg = answer(body)
          msg.role = "assistant"
          req:reply(200, json.encode { choices = json.array { { message = msg } } })
        end
        if delay_ms > 0 then core.timer(delay_ms, respond) else respond() end
      end,
    })
    local cli = require("sandbox.drivers.cli") { binary = "docker" }
    local driver = {
      run = function(_, spec, turn, signal, report)
        local mode = turn.text and turn.text:match("PROBE:(%a+)")
        if mode then spec.image = assert(images[mode]) end
        return cli:run(spec, turn, signal, report)
      end,
      list = function(_, ...) return cli:list(...) end,
      remove = function(_, ...) return cli:remove(...) end,
    }
    rt = sandbox.runtime {
      image = IMAGE, runRoot = root .. "/run", workspaceRoot = root .. "/work",
      model = "fake-model", modelUrl = server:url("/v1/chat/completions"),
      apiKey = function() return KEY end, allowHttp = true, driver = driver,
      runtime = require("docker_runtime").name,
    }
  end)

  teardown(function()
    if rt then async.run(function() local t = rt:dispose(); if t then async.wait(t) end end) end
    if server then server:close() end
    probe_images.remove(images)
    if root then spec_fs.rmdir(root, "sb-sealed") end
  end)

  local function turn(channel, text)
    return async.run(function()
      local ok, r = pcall(rt.run_turn, rt, channel, SPEAKER, text)
      if not ok then return { raised = r } end
      return r
    end)
  end

  it("gives a worker no network: only loopback, no route out", function()
    local r = turn("fake:net", "PROBE:net")
    assert.is_true(r.ok, r.raised)
    -- ENETUNREACH; gVisor's netstack (runsc --network=none) answers the same
    -- missing route with EHOSTUNREACH (113): no route out either way
    local errno = D.name == "runsc" and 113 or 101
    assert.equal("ifaces=lo loopback_connect=0 routed=0 route_errno=" .. errno, r.text)
  end)

  it("refuses writes outside the workspace and /tmp", function()
    local r = turn("fake:write", "PROBE:write")
    assert.is_true(r.ok, r.raised)
    assert.equal("root=0 broker=0 app=0 workspace=1 tmp=1", r.text)
  end)

  it("stops a fork bomb at the PID limit", function()
    local r = turn("fake:fork", "PROBE:fork")
    if D.name == "runsc" then
      -- gVisor (ptrace platform) backs every guest process with a host stub
      -- process in the container's pids cgroup, so the bomb meets the limit
      -- on the host side: the sandbox itself dies (runsc exits 2) instead of
      -- fork() failing inside. Still contained: only this turn fails, its
      -- container is removed and the channel's next turn runs.
      assert.is_nil(r.raised)
      assert.is_false(r.ok)
      assert.equal("worker_failed", r.reason)
      assert.equal("", sh("docker ps -aq --filter label=roundtable.sandbox.installation=" .. rt.installation))
      local again = turn("fake:fork", "RECALL")
      assert.is_true(again.ok, again.raised)
      return
    end
    assert.is_true(r.ok, r.raised)
    local children = tonumber(r.text:match("^children=(%d+)$"))
    assert.is_true(children ~= nil and children >= 1 and children < 64, r.text)
  end)

  it("ends a worker past the memory limit, failing only its own turn", function()
    local bad, good = async.run(function()
      local a = async.spawn(function() return pcall(rt.run_turn, rt, "fake:oom", SPEAKER, "PROBE:oom") end)
      local b = async.spawn(function() return pcall(rt.run_turn, rt, "fake:good", SPEAKER, "RECALL") end)
      return { async.wait(a) }, { async.wait(b) }
    end)
    -- the memory cgroup kills the worker (exit 137, the daemon's oom event):
    -- the turn fails with worker_oom (operations.md 1), nothing is read back
    assert.is_true(bad[1])
    assert.is_true(bad[2], bad[3])
    assert.is_false(bad[3].ok, "the worker outlived its memory limit")
    assert.equal("worker_oom", bad[3].reason)
    assert.equal("sandbox worker was killed for memory", bad[3].error)
    assert.is_true(good[1])
    assert.is_true(good[2], good[3])
    assert.is_true(good[3].ok)
    -- the same channel's next turn works
    local again = turn("fake:oom", "RECALL")
    assert.is_true(again.ok, again.raised)
    assert.equal("", sh("docker ps -aq --filter label=roundtable.sandbox.installation=" .. rt.installation))
  end)

  it("runs two channels' turns at the same time", function()
    delay_ms, max_in_flight = 1500, 0
    local a, b = async.run(function()
      local ta = async.spawn(function() return rt:run_turn("fake:one", SPEAKER, "RECALL") end)
      local tb = async.spawn(function() return rt:run_turn("fake:two", SPEAKER, "RECALL") end)
      return select(2, async.wait(ta)), select(2, async.wait(tb))
    end)
    delay_ms = 0
    assert.is_true(a.ok and b.ok)
    assert.equal(2, max_in_flight)
  end)

  it("keeps memory and history between turns, and in their channel", function()
    local first = turn("fake:alpha", "REMEMBER:alpha-fact")
    assert.is_true(first.ok, first.raised)
    assert.equal("saved", first.text)
    local recall = turn("fake:alpha", "RECALL")
    assert.equal("system:yes history:yes", recall.text)
    local other = turn("fake:beta", "RECALL")
    assert.equal("system:no history:no", other.text)
  end)
end)
