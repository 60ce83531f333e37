-- rich/docker_spec.lua: sandbox.rich.dockerDriver against a scripted Engine
-- API on a real Unix socket (spec/fixtures/rich_docker_api.mjs): the 5.2
-- checks before any call, the create body of 5.3 (behaviours 12-17), the
-- 5.4 operations and their error text, the framed log stream (18) and
-- ensureRunning's keep-or-recreate rule (19).
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local rich = require "sandbox.rich"
local seccomp = require "sandbox.runtime._seccomp"
local rich_docker_fake = require "rich_docker_fake"
local spec_fs = require "spec_fs"

local write = spec_fs.write

describe("rich Docker driver (fake Engine API)", function()
  local fake, dir, sock

  setup(function()
    fake = rich_docker_fake.start("rich-dk")
    dir, sock = fake.dir, fake.sock
  end)

  teardown(function() if fake then fake:stop() end end)

  local function state(t) fake:state(t) end
  local function requests() return fake:requests() end

  local function calls()
    local out = {}
    for _, r in ipairs(requests()) do out[#out + 1] = r.method .. " " .. r.url end
    return out
  end

  local function spec(over)
    local s = {
      name = "roundtable-sandbox-discord_party", image = "pi-roundtable-sandbox:pi", channel = "discord:party",
      profile = "main", timeZone = "UTC", labelChannel = "roundtable.sandbox.channel",
      labelProfile = "roundtable.sandbox.profile", runDir = dir .. "/run", workspaceDir = dir .. "/ws",
      uid = 1000, gid = 1000,
    }
    for k, v in pairs(over or {}) do s[k] = v end
    return s
  end

  local function create_body()
    for _, r in ipairs(requests()) do
      if r.url:find("^/containers/create") then return json.plain(json.decode(r.body)) end
    end
  end

  local function run(fn) return async.run(fn) end

  it("B12-B14: the create body isolates the worker and bounds it", function()
    state({})
    local d = rich.dockerDriver { socket = sock }
    run(function() d.ensureRunning(spec()) end)
    assert.same({
      "GET /containers/roundtable-sandbox-discord_party/json",
      "POST /containers/create?name=roundtable-sandbox-discord_party",
      "POST /containers/roundtable-sandbox-discord_party/start",
    }, calls())
    local b = create_body()
    local h = b.HostConfig
    assert.equal("pi-roundtable-sandbox:pi", b.Image)
    assert.equal("1000:1000", b.User)
    assert.equal("none", h.NetworkMode)
    assert.is_true(h.ReadonlyRootfs)
    assert.same({ "ALL" }, h.CapDrop)
    -- no-new-privileges, then the rich image's own seccomp allow-list, inline (hardening.md 1)
    assert.equal(2, #h.SecurityOpt)
    assert.equal("no-new-privileges", h.SecurityOpt[1])
    assert.same(json.plain(json.decode(assert(spec_fs.read(seccomp.default_path("rich"))))),
      json.plain(json.decode(assert(h.SecurityOpt[2]:match("^seccomp=(.*)$")))))
    assert.same({ dir .. "/run:/run/sandbox:ro", dir .. "/ws:/workspace" }, h.Binds)
    assert.is_nil(h.Mounts)
    assert.equal(1536 * 1024 * 1024, h.Memory)
    assert.equal(h.Memory, h.MemorySwap)
    assert.equal(1000000000, h.NanoCpus)
    assert.equal(256, h.PidsLimit)
    assert.same({ ["/tmp"] = "rw,nosuid,nodev,size=512m,mode=1777" }, h.Tmpfs)
    assert.same({ { Name = "nofile", Soft = 256, Hard = 256 } }, h.Ulimits)
    assert.same({ Name = "unless-stopped" }, h.RestartPolicy)
    assert.same({ ["roundtable.sandbox.channel"] = "discord:party", ["roundtable.sandbox.profile"] = "main" }, b.Labels)
    -- B13: the dummy token and no host secret, in the page's order
    assert.same({
      "SANDBOX_PROFILE=main", "TZ=UTC", "ANTHROPIC_BASE_URL=http://127.0.0.1:8080/anthropic",
      "CLAUDE_CODE_OAUTH_TOKEN=sandbox-dummy-token", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
      "SANDBOX_CONTENT=/app/worker/content.ts", "HOME=/tmp/home", "PI_CODING_AGENT_DIR=/tmp/pi-agent",
      "CLAUDE_CONFIG_DIR=/workspace/claude",
    }, b.Env)
  end)

  it("B15: the default log config is journald tagged sandbox/<channel>", function()
    state({})
    run(function() rich.dockerDriver { socket = sock }.ensureRunning(spec({ channel = "discord:party" })) end)
    assert.same({ Type = "journald", Config = { tag = "sandbox/discord:party" } }, create_body().HostConfig.LogConfig)
    state({})
    run(function() rich.dockerDriver { socket = sock }.ensureRunning(spec({ channel = "slack:é x" })) end)
    assert.equal("sandbox/slack:__x", create_body().HostConfig.LogConfig.Config.tag)
  end)

  it("B16/B17: a log driver named -bad is refused before any call; local max-size=10m reaches the body", function()
    state({})
    local d = rich.dockerDriver { socket = sock, log = { driver = "-bad" } }
    local ok, err = pcall(run, function() d.ensureRunning(spec()) end)
    assert.is_false(ok)
    assert.matches("log driver", err)
    assert.same({}, calls())
    for _, bad in ipairs { { driver = "local", options = { ["Max"] = "1" } }, { driver = "local", options = { ["max-size"] = "1\n" } } } do
      assert.has_error(function() run(function() rich.dockerDriver { socket = sock, log = bad }.ensureRunning(spec()) end) end,
        "Invalid container log driver")
    end
    local d2 = rich.dockerDriver { socket = sock, log = function(channel)
      assert.equal("discord:party", channel)
      return { driver = "local", options = { ["max-size"] = "10m" } }
    end }
    run(function() d2.ensureRunning(spec()) end)
    assert.same({ Type = "local", Config = { ["max-size"] = "10m" } }, create_body().HostConfig.LogConfig)
  end)

  it("5.2: the spec checks run before any daemon call, each with its message", function()
    state({})
    local d = rich.dockerDriver { socket = sock }
    local cases = {
      { { name = "Roundtable-X" }, "Invalid container specification" },
      { { profile = "bad profile" }, "Invalid container specification" },
      { { image = "-x" }, "Invalid container specification" },
      { { image = "a b" }, "Invalid container specification" },
      { { uid = 0 }, "Worker must be non-root" },
      { { gid = 0 }, "Worker must be non-root" },
      { { runDir = "relative" }, "Invalid mount path" },
      { { workspaceDir = dir .. "/a:b" }, "Invalid mount path" },
      { { runDir = "/" }, "Invalid mount path" },
      { { timeZone = "Nowhere/City" }, "Invalid time zone" },
    }
    for _, c in ipairs(cases) do
      assert.has_error(function() run(function() d.ensureRunning(spec(c[1])) end) end, c[2])
    end
    assert.same({}, calls())
  end)

  it("B19: ensureRunning keeps a running container of the same image and profile, recreates otherwise", function()
    local name = "roundtable-sandbox-discord_party"
    local labels = { ["roundtable.sandbox.profile"] = "main" }
    state({ containers = { [name] = { running = true, image = "pi-roundtable-sandbox:pi", labels = labels } } })
    local d = rich.dockerDriver { socket = sock }
    run(function() d.ensureRunning(spec()) end)
    assert.same({ "GET /containers/" .. name .. "/json" }, calls())
    for _, c in ipairs {
      { running = false, image = "pi-roundtable-sandbox:pi", labels = labels },
      { running = true, image = "other:tag", labels = labels },
      { running = true, image = "pi-roundtable-sandbox:pi", labels = { ["roundtable.sandbox.profile"] = "other" } },
    } do
      state({ containers = { [name] = c } })
      run(function() d.ensureRunning(spec()) end)
      assert.same({ "GET /containers/" .. name .. "/json", "DELETE /containers/" .. name .. "?force=true",
        "POST /containers/create?name=" .. name, "POST /containers/" .. name .. "/start" }, calls())
    end
  end)

  it("status, remove and the error text of 5.4", function()
    local name = "roundtable-sandbox-x"
    state({ containers = { [name] = { running = true, image = "img:1", labels = { ["my.profile"] = "p" } } } })
    local d = rich.dockerDriver { socket = sock, labelProfile = "my.profile" }
    run(function()
      assert.same({ state = "running", image = "img:1", profile = "p" }, d.status(name))
      assert.same({ state = "missing" }, d.status("roundtable-sandbox-y"))
      d.remove(name)
      d.remove(name)                                  -- 404 is accepted
      assert.same({ state = "missing" }, d.status(name))
    end)
    state({ inspect = 500 })
    local ok, err = pcall(run, function() d.status(name) end)
    assert.is_false(ok)
    assert.equal("docker GET /containers/" .. name .. "/json failed with 500: ", err:sub(1, #("docker GET /containers/" .. name .. "/json failed with 500: ")))
    assert.equal(300, utf8.len(err:match("failed with 500: (.*)$")))
    state({ create = 404 })
    ok, err = pcall(run, function() d.ensureRunning(spec({ image = "absent:never" })) end)
    assert.is_false(ok)
    assert.matches("^docker POST /containers/create%?name=roundtable%-sandbox%-discord_party failed with 404: ", err)
    assert.matches("No such image: absent:never", err, 1, true)
    local gone = rich.dockerDriver { socket = dir .. "/nothing.sock" }
    ok, err = pcall(run, function() gone.status(name) end)
    assert.is_false(ok)
    assert.matches("^docker GET ", err)
  end)

  it("B18: the framed log stream reads back as the payloads joined; plain text unchanged", function()
    local name = "roundtable-sandbox-x"
    local d = rich.dockerDriver { socket = sock }
    state({ containers = { [name] = { running = true, image = "i" } }, logLines = { { 1, "out one\n" }, { 2, "err two\n" }, { 1, "out three\n" } } })
    run(function() assert.equal("out one\nerr two\nout three\n", d.logs(name, 200)) end)
    assert.equal("GET /containers/" .. name .. "/logs?stdout=1&stderr=1&tail=200", calls()[1])
    state({ containers = { [name] = { running = true, image = "i" } }, logsBody = "raw", logLines = { { 1, "just text\n" } } })
    run(function() assert.equal("just text\n", d.logs(name, 0.5)) end)
    assert.equal("GET /containers/" .. name .. "/logs?stdout=1&stderr=1&tail=1", calls()[1])
    state({})
    run(function() assert.equal("", d.logs(name, 10)) end)
  end)
end)
