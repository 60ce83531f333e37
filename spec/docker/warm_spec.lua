-- docker/warm_spec.lua: warm turns on the real daemon (spec/warm-turns.md,
-- its behaviours 1-6): each channel's next container waits, fresh and
-- unbound, for the channel's next turn; it serves exactly that turn and is
-- removed; idle, LRU, dispose, a lost container, a failed start and a crash
-- leave nothing running. The test images are FROM scratch, built from
-- spec/fixtures/hostile/warm_probe.c (hello: replies with its hostname, i.e.
-- Docker's short container id, and the turn's text; early: calls the broker
-- before reading stdin; linger: replies, then ignores SIGTERM and keeps
-- writing into the workspace). Both built-in drivers run the same cases.
-- Opt-in with SANDBOX_DOCKER_TEST=1.
local async = require "sandbox.async"
local D = require "docker_runtime"
local core = require "sandbox.core"
local probe_images = require "probe_images"
local sandbox = require "sandbox"
local spec_fs = require "spec_fs"

local ENABLED = os.getenv("SANDBOX_DOCKER_TEST") == "1"
local TAG = core.random_hex(4)
local SPEAKER = { id = "guest", name = "Guest", principalId = "p_guest" }
local LABEL = "roundtable.sandbox.installation"

local q = spec_fs.q
local function sh(cmd) return spec_fs.run(cmd .. " 2>&1") end

if not ENABLED then
  describe("warm turns on real Docker", function()
    pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker specs (make check does)")
  end)
  return
end

-- The names of this installation's containers (any state), sorted.
local function containers(rt, all)
  local out = sh("docker ps " .. (all and "-a " or "") .. "--format '{{.Names}}' --filter label="
    .. LABEL .. "=" .. rt.installation)
  local list = {}
  for name in out:gmatch("[^\n]+") do list[#list + 1] = name end
  table.sort(list)
  return list
end

local function hostname_of(name)
  return (sh("docker inspect --format '{{.Config.Hostname}}' " .. q(name)):gsub("%s+$", ""))
end

-- Inside a task: polls fn every 50 ms until it returns a true value or ms pass.
local function until_true(fn, ms)
  local deadline = core.now() + (ms or 30000)
  while core.now() < deadline do
    local v = fn()
    if v then return v end
    async.sleep(50)
  end
  return fn()
end

local function turn_dirs(root)
  local out = sh("ls -A " .. q(root .. "/run"))
  local list = {}
  for name in out:gmatch("[^\n]+") do if name:find("^turn%-") then list[#list + 1] = name end end
  return list
end

-- Nothing of this runtime left: no container (any state), no turn dir.
local function drained(rt, dir)
  return #containers(rt, true) == 0 and #turn_dirs(dir) == 0
end

local function gauge(rt, state)
  return tonumber(rt:metrics():match('sbx_containers{state="' .. state .. '"} (%d+)'))
end

describe("warm turns on real Docker", function()
  local root, server, images
  local runtimes = {}
  local tool_calls = 0

  setup(function()
    probe_images.require_docker()
    root = spec_fs.tmpdir("sb-warm")
    images = probe_images.build(root, "spec/fixtures/hostile/warm_probe.c", { "hello", "early", "linger" },
      function(mode) return "sbx-warm-spec-" .. mode .. ":" .. TAG end)
    server = assert(core.http_server {
      on_request = function(req) req:reply(500, "{}") end,     -- the probes never call the model
    })
  end)

  teardown(function()
    for _, rt in ipairs(runtimes) do pcall(async.run, function() rt:dispose() end) end
    if server then server:close() end
    if images then probe_images.remove(images) end
    if root then spec_fs.rmdir(root, "sb-warm") end
  end)

  local n = 0
  -- A runtime over fresh roots with the given image mode and options.
  local function runtime(mode, extra)
    n = n + 1
    local dir = root .. "/" .. n
    os.execute("mkdir -p " .. q(dir))
    local cap = { lines = {} }
    function cap.find(_, text)
      for _, l in ipairs(cap.lines) do if l:find(text, 1, true) then return l end end
    end
    local function keep(msg, fields)
      local parts = { msg }
      for k, v in pairs(fields or {}) do parts[#parts + 1] = tostring(k) .. "=" .. tostring(v) end
      cap.lines[#cap.lines + 1] = table.concat(parts, " ")
    end
    local opts = {
      image = images[mode], runRoot = dir .. "/run", workspaceRoot = dir .. "/work",
      model = "fake", modelUrl = server:url("/v1/chat/completions"), allowHttp = true,
      apiKey = function() return "k" end, turnTimeoutMs = 20000, runtime = D.name,
      logger = { debug = keep, info = keep, warn = keep, error = keep },
      tools = { { name = "probe", description = "counts", parameters = {},
                  run = function() tool_calls = tool_calls + 1; return "counted" end } },
    }
    for k, v in pairs(extra or {}) do opts[k] = v end
    local rt = sandbox.runtime(opts)
    runtimes[#runtimes + 1] = rt
    local records = {}
    rt.recorder:subscribe(function(r) records[#records + 1] = r end)
    return rt, dir, cap, records
  end

  local function turns_of(records)
    local list = {}
    for _, r in ipairs(records) do if r.kind == "turn" then list[#list + 1] = r end end
    return list
  end

  local function leaves_nothing(rt, dir)
    async.run(function() rt:dispose() end)
    assert.same({}, containers(rt, true))
    assert.same({}, turn_dirs(dir))
  end

  for _, driver_name in ipairs { "cli", "engine" } do
    local function driver() return require("sandbox.drivers." .. driver_name)() end

    describe("with the " .. driver_name .. " driver", function()
      it("serves each turn in a fresh container of its own channel, waiting between turns (behaviours 1, 5 of docker ps)",
        function()
        local rt, dir, _, records = runtime("hello", { driver = driver() })
        async.run(function()
          local a1 = rt:run_turn("fake:a", SPEAKER, "A1")
          assert.is_true(a1.ok, a1.reason)
          local h1 = a1.text:match("host=(%S+)")
          assert.truthy(a1.text:find("text=A1", 1, true))
          -- the channel's next container waits, labelled with this installation
          local warm_a = until_true(function() local l = containers(rt); return #l == 1 and l[1] end)
          assert.truthy(warm_a, "no warm container for channel a")
          assert.equal(1, until_true(function() return gauge(rt, "warm") == 1 and 1 end))
          assert.equal("true", (sh("docker inspect --format '{{.State.Running}}' " .. q(warm_a)):gsub("%s+$", "")))
          local b1 = rt:run_turn("fake:b", SPEAKER, "B1")
          assert.is_true(b1.ok)
          local warm_b = until_true(function()
            for _, c in ipairs(containers(rt)) do if c ~= warm_a then return c end end
          end)
          assert.truthy(warm_b, "no warm container for channel b")
          assert.equal(2, until_true(function() return gauge(rt, "warm") == 2 and 2 end))
          local host_a, host_b = hostname_of(warm_a), hostname_of(warm_b)
          -- channel a's second turn lands in channel a's waiting container, never b's
          local a2 = rt:run_turn("fake:a", SPEAKER, "A2")
          assert.is_true(a2.ok)
          assert.equal(host_a, a2.text:match("host=(%S+)"))
          assert.truthy(a2.text:find("text=A2", 1, true))
          assert.is_not.equal(h1, host_a)
          local b2 = rt:run_turn("fake:b", SPEAKER, "B2")
          assert.equal(host_b, b2.text:match("host=(%S+)"))
          -- never reused: a third turn of a sees yet another container
          local warm_a2 = until_true(function()
            for _, c in ipairs(containers(rt)) do if c ~= warm_b and c ~= warm_a then return c end end
          end)
          assert.truthy(warm_a2)
          local a3 = rt:run_turn("fake:a", SPEAKER, "A3")
          local hosts = { h1, host_a, a3.text:match("host=(%S+)"), host_b }
          local seen = {}
          for _, h in ipairs(hosts) do assert.is_nil(seen[h], "a container served two turns"); seen[h] = true end
        end)
        local t = turns_of(records)
        assert.equal(5, #t)
        assert.same({ false, false, true, true, true }, { t[1].warm == true, t[2].warm == true, t[3].warm == true,
          t[4].warm == true, t[5].warm == true })
        leaves_nothing(rt, dir)
      end)

      it("answers a PID 1 calling the broker before its turn with 503, no hook, no budget (behaviour 2)", function()
        local rt, dir, cap, records = runtime("early", { driver = driver() })
        tool_calls = 0
        async.run(function()
          local first = rt:run_turn("fake:a", SPEAKER, "cold")
          -- cold: the broker was bound before the container started
          assert.truthy(first.text:find("early=200 late=200", 1, true), first.text)
          assert.equal(2, tool_calls)
          until_true(function() return #containers(rt) == 1 end)
          -- the warm container has called already, while unbound
          until_true(function()
            for _, r in ipairs(records) do if r.kind == "call" and r.reason == "not_bound" then return true end end
          end)
          local second = rt:run_turn("fake:a", SPEAKER, "warm")
          assert.truthy(second.text:find("early=503 late=200", 1, true), second.text)
        end)
        assert.equal(3, tool_calls)           -- the unbound call reached no hook
        local refused
        for _, r in ipairs(records) do if r.kind == "call" and r.reason == "not_bound" then refused = r end end
        assert.equal(503, refused.status)
        assert.is_false(refused.accepted)     -- step 9 never ran: no budget spent
        local t = turns_of(records)
        assert.equal(1, t[2].tool_calls)
        assert.equal(0, t[2].refused_calls)
        assert.truthy(cap:find("not_bound"))  -- the audit line (operations.md 3)
        leaves_nothing(rt, dir)
      end)

      it("kills a warm turn at its deadline and binds the next only once that container is gone (behaviours 3, 6)",
        function()
        local rt, dir, _, records = runtime("linger", { driver = driver(), turnTimeoutMs = 2000 })
        local since = os.time() - 1
        local work, elapsed
        async.run(function()
          local first = rt:run_turn("fake:a", SPEAKER, "one")      -- cold, replies and exits
          assert.is_true(first.ok, first.reason)
          work = dir .. "/work/" .. sh("ls " .. q(dir .. "/work")):gsub("%s+$", "")
          assert.truthy(until_true(function() return #containers(rt) == 1 end))
          -- warm: replies, then ignores SIGTERM and writes into the workspace
          local t0 = core.now()
          local second = rt:run_turn("fake:a", SPEAKER, "two")
          elapsed = core.now() - t0
          assert.equal("deadline", second.reason)
          -- at once: its container may still be being removed, and writing
          local third = rt:run_turn("fake:a", SPEAKER, "three")
          assert.equal("deadline", third.reason)
        end)
        assert.is_true(elapsed < 8000, "took " .. elapsed .. " ms")
        local t = turns_of(records)
        assert.same({ false, true, false }, { t[1].warm == true, t[2].warm == true, t[3].warm == true })
        async.run(function() rt:dispose() end)
        -- every container of the channel was destroyed before the next one was created
        local out = sh("docker events --since " .. since .. " --until " .. (os.time() + 1)
          .. " --filter label=" .. LABEL .. "=" .. rt.installation
          .. " --filter event=create --filter event=destroy --format '{{.Action}} {{.Actor.Attributes.name}}'")
        local live, creates = {}, 0
        for action, name in out:gmatch("(%a+) (%S+)") do
          if action == "create" then
            assert.is_nil(next(live), "created " .. name .. " while another container of the channel existed")
            live[name] = true
            creates = creates + 1
          else
            live[name] = nil
          end
        end
        assert.equal(3, creates, out)       -- the deadline turns leave the channel cold
        assert.is_nil(next(live), out)
        -- nothing writes into the workspace any more
        local ticks = spec_fs.read(work .. "/tick")
        assert.truthy(ticks and #ticks > 0, "the lingering containers never wrote")
        async.run(function() async.sleep(300) end)
        assert.equal(ticks, spec_fs.read(work .. "/tick"))
        leaves_nothing(rt, dir)
      end)

      it("removes an idle warm container after idleMs; the next turn runs cold (behaviour 4)", function()
        local rt, dir, cap, records = runtime("hello", { driver = driver(), warm = { channels = 4, idleMs = 1000 } })
        async.run(function()
          assert.is_true(rt:run_turn("fake:a", SPEAKER, "one").ok)
          assert.truthy(until_true(function() return #containers(rt) == 1 end))
          -- idleMs, then the removal: the default 30 s wait, as removals take
          -- seconds under runsc on a loaded daemon
          assert.truthy(until_true(function() return drained(rt, dir) end))
          assert.equal(0, gauge(rt, "warm"))
          assert.is_true(rt:run_turn("fake:a", SPEAKER, "two").ok)
        end)
        local t = turns_of(records)
        assert.is_nil(t[2].warm)
        assert.is_nil(cap:find("warm container lost"))
        leaves_nothing(rt, dir)
      end)

      it("evicts the least recently used channel's container at the cap (behaviour 4)", function()
        local rt, dir, cap, records = runtime("hello", { driver = driver(), warm = { channels = 1 } })
        async.run(function()
          assert.is_true(rt:run_turn("fake:a", SPEAKER, "a").ok)
          local wa = until_true(function() local l = containers(rt); return #l == 1 and l[1] end)
          assert.is_true(rt:run_turn("fake:b", SPEAKER, "b").ok)
          local wb = until_true(function() local l = containers(rt); return #l == 1 and l[1] ~= wa and l[1] end)
          assert.truthy(wb, "b's container did not replace a's: " .. table.concat(containers(rt, true), ",")
            .. " | " .. table.concat(cap.lines, " | "))
          assert.is_true(rt:run_turn("fake:a", SPEAKER, "a2").ok)     -- cold: a was evicted
          assert.truthy(until_true(function()
            local l = containers(rt); return #l == 1 and l[1] ~= wb
          end), "a's container did not replace b's")
          assert.is_true(rt:run_turn("fake:b", SPEAKER, "b2").ok)     -- cold: b was evicted by a's refill
        end)
        local t = turns_of(records)
        assert.same({ false, false, false, false }, { t[1].warm == true, t[2].warm == true, t[3].warm == true,
          t[4].warm == true })
        leaves_nothing(rt, dir)
      end)

      it("runs cold after a warm container died, logging it (behaviour 4)", function()
        local rt, dir, cap, records = runtime("hello", { driver = driver() })
        async.run(function()
          assert.is_true(rt:run_turn("fake:a", SPEAKER, "one").ok)
          local w = until_true(function() local l = containers(rt); return #l == 1 and l[1] end)
          sh("docker kill " .. q(w))
          assert.truthy(until_true(function() return cap:find("warm container lost") end))
          assert.truthy(until_true(function() return drained(rt, dir) end))
          local r = rt:run_turn("fake:a", SPEAKER, "two")
          assert.is_true(r.ok, r.reason)
        end)
        assert.is_nil(turns_of(records)[2].warm)
        leaves_nothing(rt, dir)
      end)

      it("leaves the channel cold when the warm start fails (image removed; behaviour 4)", function()
        local image = "sbx-warm-spec-gone:" .. TAG .. driver_name
        assert.equal(0, select(2, sh("docker tag " .. images.hello .. " " .. image)))
        local rt, dir, cap, records = runtime("hello", { driver = driver(), image = image })
        async.run(function()
          assert.is_true(rt:run_turn("fake:a", SPEAKER, "one").ok)
          assert.truthy(until_true(function() return #containers(rt) == 1 end))
          -- the tag goes (the image stays under its other name): the waiting
          -- container still serves its turn, the next warm start fails
          sh("docker image rm " .. image)
          assert.is_true(rt:run_turn("fake:a", SPEAKER, "two").ok)
          assert.truthy(until_true(function() return cap:find("warm container lost") end))
          assert.truthy(until_true(function() return drained(rt, dir) end))
          local r3 = rt:run_turn("fake:a", SPEAKER, "three")
          assert.equal("image_missing", r3.reason)
        end)
        local t = turns_of(records)
        assert.same({ false, true, false }, { t[1].warm == true, t[2].warm == true, t[3].warm == true })
        leaves_nothing(rt, dir)
      end)

      it("dispose removes every warm container and waits for it (behaviour 4)", function()
        local rt, dir = runtime("hello", { driver = driver() })
        async.run(function()
          for _, ch in ipairs { "fake:a", "fake:b", "fake:c" } do assert.is_true(rt:run_turn(ch, SPEAKER, "x").ok) end
          assert.truthy(until_true(function() return #containers(rt) == 3 end))
          rt:dispose()
        end)
        assert.same({}, containers(rt, true))
        assert.same({}, turn_dirs(dir))
      end)
    end)
  end

  it("a new runtime's startup sweep removes the warm containers a crashed host left (behaviour 5)", function()
    local dir = root .. "/crash"
    os.execute("mkdir -p " .. q(dir))
    local script = dir .. "/host.lua"
    spec_fs.write(script, ([[
local async = require "sandbox.async"
local sandbox = require "sandbox"
local rt = sandbox.runtime { image = %q, runRoot = %q, workspaceRoot = %q, model = "fake",
  modelUrl = %q, allowHttp = true, apiKey = function() return "k" end, %s }
async.run(function()
  assert(rt:run_turn("fake:a", { id = "g", name = "G", principalId = "p" }, "x").ok)
  -- until the channel's warm container runs (the turn's own has exited by
  -- now), up to 30 s: a fixed pause was short for a start under runsc
  for _ = 1, 300 do
    local ps = io.popen("docker ps -q --filter status=running --filter label=%s=" .. rt.installation)
    local ids = ps:read("a")
    ps:close()
    if ids:match("%%x") then break end
    async.sleep(100)
  end
  io.stdout:write(rt.installation, "\n")
  io.stdout:flush()
  os.exit(1, false)       -- no dispose: a crash leaves the warm container
end)
]]):format(images.hello, dir .. "/run", dir .. "/work", server:url("/v1/chat/completions"), D.lua(), LABEL))
    -- the child runs on its own loop; the spec's server answers nothing it needs
    local out, rc = sh("LUA_PATH=" .. q(package.path) .. " LUA_CPATH=" .. q(package.cpath)
      .. " lua5.4 " .. q(script) .. " 2>/dev/null")
    assert.is_not.equal(0, rc)
    local installation = out:match("(%x+)%s*$")
    assert.truthy(installation, out)
    local left = sh("docker ps -aq --filter label=" .. LABEL .. "=" .. installation)
    assert.is_not.equal("", left, "the crashed host left no warm container to sweep")
    local rt = sandbox.runtime { image = images.hello, runRoot = dir .. "/run", workspaceRoot = dir .. "/work",
      model = "fake", modelUrl = server:url("/v1/chat/completions"), allowHttp = true,
      apiKey = function() return "k" end, runtime = D.name }
    runtimes[#runtimes + 1] = rt
    async.run(function() rt:sweep() end)
    assert.equal("", sh("docker ps -aq --filter label=" .. LABEL .. "=" .. installation))
    async.run(function() rt:dispose() end)
    assert.same({}, turn_dirs(dir))
  end)
end)
