-- driver_render_spec.lua: every Docker rendering of lua/sandbox/drivers/ is
-- pinned to what main rendered at 6c47593 (spec/fixtures/render_golden.lua,
-- generated from that commit for these very inputs): the sealed turn's and
-- the precheck run's `docker run` argv and Engine API body (spec/runtime.md
-- 4.3, precheck.md 6.1), rich mode's create body (rich-mode.md 5.3-5.4),
-- whichever driver asks. The rich CLI argv (new: `docker create`) is pinned
-- here and read back flag by flag against the body it must equal.
local json = require "sandbox.json"
local sealed = require "sandbox.drivers._sealed"
local rich = require "sandbox.drivers._rich"
local rich_container = require "sandbox.rich._container"
local cli = require "sandbox.drivers.cli"
local engine = require "sandbox.drivers.engine"
local seccomp = require "sandbox.drivers._seccomp"
local spec_fs = require "spec_fs"

local golden = dofile("spec/fixtures/render_golden.lua")

local L = { ["roundtable.sandbox.installation"] = "0123456789abcdef", ["roundtable.sandbox.owner"] = "discord:42" }
local function base(over)
  local s = { name = "roundtable-sandbox-0123456789abcdef-89abcdef", image = "pi-roundtable-sandbox:local",
    runDir = "/srv/sbx/run/a", workspaceDir = "/srv/sbx/ws/a", uid = 1000, gid = 1001, memoryMb = 512,
    cpus = 1.5, pids = 64, labels = L, canonical = true }
  for k, v in pairs(over or {}) do s[k] = v end
  return s
end
local SEALED = {
  { "plain", base() },
  { "seccomp", base { seccompProfile = "@SECCOMP@" } },
  { "runtime", base { seccompProfile = "@SECCOMP@", runtime = "runsc", cpus = 0.25, memoryMb = 64, pids = 8 } },
  { "unlabelled", base { labels = {}, cpus = 2 } },
  { "precheck", base { name = "roundtable-precheck-0123456789abcdef", labels = false, workspaceReadOnly = true,
      entrypoint = { "/usr/local/bin/bun", "run", "/workspace/check.ts" }, seccompProfile = "@SECCOMP@", cpus = 1,
      memoryMb = 256 } },
}
local function rich_spec(over)
  local s = { name = "roundtable-sandbox-discord_party", image = "pi-roundtable-sandbox:pi",
    channel = "discord:party \u{e9}", profile = "main", timeZone = "UTC", labelChannel = "roundtable.sandbox.channel",
    labelProfile = "roundtable.sandbox.profile", runDir = "/srv/party/c/run", workspaceDir = "/srv/party/c/workspace",
    uid = 1000, gid = 1001 }
  for k, v in pairs(over or {}) do s[k] = v end
  return s
end
local RICH = {
  { "journald", rich_spec(), nil },
  { "local", rich_spec { timeZone = "Europe/Paris", labelChannel = "x.channel", labelProfile = "x.profile" },
    { driver = "local", options = { ["max-size"] = "10m", ["max-file"] = "3", compress = "true" } } },
  { "spec_log", rich_spec { log = { driver = "json-file" } }, { driver = "local" } },
  { "fn_log", rich_spec(), function(ch) return { driver = "syslog", options = { tag = "t/" .. #ch } } end },
}

describe("the drivers' Docker renderings", function()
  local dir, profile

  setup(function()
    dir = spec_fs.tmpdir("drv-render")
    profile = dir .. "/profile.json"
    spec_fs.write(profile,
      '{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"}]}')
  end)

  teardown(function()
    seccomp.forget(profile)
    if dir then spec_fs.rmdir(dir, "drv-render") end
  end)

  local function unpath(s) return (s:gsub(profile:gsub("%p", "%%%0"), "@SECCOMP@")) end

  local function checked(s)
    local copy = {}
    for k, v in pairs(s) do copy[k] = v end
    if copy.seccompProfile then copy.seccompProfile = profile end
    return sealed.check(copy)
  end

  for _, case in ipairs(SEALED) do
    it("the sealed " .. case[1] .. " container: the CLI driver's argv is main's, element for element", function()
      local d = cli.new { binary = "docker" }
      local h = d:create(checked(case[2]), nil)
      local argv = {}
      for i, a in ipairs(h.argv) do argv[i] = unpath(a) end
      assert.are.same(golden["sealed_" .. case[1] .. "_argv"], argv)
    end)

    it("the sealed " .. case[1] .. " container: the Engine API body is main's, byte for byte", function()
      assert.are.equal(golden["sealed_" .. case[1] .. "_body"], unpath(sealed.body(checked(case[2]))))
    end)
  end

  for _, case in ipairs(RICH) do
    it("the rich " .. case[1] .. " container: the Engine API driver's create body is main's, byte for byte", function()
      local logcfg = rich_container.check(case[2], case[3])
      local r = engine.new { socket = "/nonexistent" }:render_lasting(case[2], logcfg)
      assert.are.equal(golden["rich_" .. case[1] .. "_body"], r.rendered)
      assert.are.equal(golden["rich_" .. case[1] .. "_body"], require("sandbox.drivers._rich").body(case[2], logcfg))
      assert.are.same({ case[2].name, case[2].image, case[2].profile }, { r.name, r.image, r.profile })
    end)
  end

  it("the rich CLI argv is pinned: docker create of the 5.3 settings", function()
    local s = rich_spec()
    local argv = rich.argv(s, rich_container.check(s, nil), "/run/env")
    assert.are.same({
      "create", "--name", "roundtable-sandbox-discord_party", "--pull", "never",
      "--user", "1000:1001", "--env-file", "/run/env",
      "--label", "roundtable.sandbox.channel=discord:party \u{e9}", "--label", "roundtable.sandbox.profile=main",
      "--network", "none", "--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,size=512m,mode=1777",
      "--memory", "1610612736", "--memory-swap", "1610612736", "--cpus", "1", "--pids-limit", "256",
      "--ulimit", "nofile=256:256", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
      "--volume", "/srv/party/c/run:/run/sandbox:ro", "--volume", "/srv/party/c/workspace:/workspace",
      "--restart", "unless-stopped", "--log-driver", "journald", "--log-opt", "tag=sandbox/discord:party__",
      "pi-roundtable-sandbox:pi",
    }, argv)
    -- the environment in the page's order, as the env file's lines (the CLI
    -- reorders repeated --env flags; it keeps an env file's lines in order)
    assert.are.equal("SANDBOX_PROFILE=main\nTZ=UTC\nANTHROPIC_BASE_URL=http://127.0.0.1:8080/anthropic\n"
      .. "CLAUDE_CODE_OAUTH_TOKEN=sandbox-dummy-token\nCLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1\n"
      .. "SANDBOX_CONTENT=/app/worker/content.ts\nHOME=/tmp/home\nPI_CODING_AGENT_DIR=/tmp/pi-agent\n"
      .. "CLAUDE_CONFIG_DIR=/workspace/claude\n", rich.env_file(s))
  end)

  -- The argv read back the way the docker CLI reads it, as the body's fields.
  local function as_body(argv, stdin)
    local b = { Env = {}, Labels = {}, HostConfig = { Binds = {}, Tmpfs = {}, LogConfig = { Config = {} } } }
    local h = b.HostConfig
    local i = 2
    while i <= #argv do
      local f, v = argv[i], argv[i + 1]
      if f == "--read-only" then h.ReadonlyRootfs = true; i = i + 1
      elseif f:sub(1, 2) ~= "--" then b.Image = f; i = i + 1
      else
        i = i + 2
        if f == "--user" then b.User = v
        elseif f == "--env-file" then
          assert.are.equal("/run/env", v)
          for line in stdin:gmatch("([^\n]*)\n") do b.Env[#b.Env + 1] = line end
        elseif f == "--label" then local k, x = v:match("^([^=]*)=(.*)$"); b.Labels[k] = x
        elseif f == "--network" then h.NetworkMode = v
        elseif f == "--tmpfs" then local k, x = v:match("^([^:]*):(.*)$"); h.Tmpfs[k] = x
        elseif f == "--memory" then h.Memory = math.tointeger(tonumber(v))
        elseif f == "--memory-swap" then h.MemorySwap = math.tointeger(tonumber(v))
        elseif f == "--cpus" then h.NanoCpus = math.tointeger(tonumber(v) * 1000000000)
        elseif f == "--pids-limit" then h.PidsLimit = math.tointeger(tonumber(v))
        elseif f == "--ulimit" then
          local n, s, hd = v:match("^(%w+)=(%d+):(%d+)$")
          h.Ulimits = { { Name = n, Soft = math.tointeger(tonumber(s)), Hard = math.tointeger(tonumber(hd)) } }
        elseif f == "--cap-drop" then h.CapDrop = { v }
        elseif f == "--security-opt" then h.SecurityOpt = { v }
        elseif f == "--volume" then h.Binds[#h.Binds + 1] = v
        elseif f == "--restart" then h.RestartPolicy = { Name = v }
        elseif f == "--log-driver" then h.LogConfig.Type = v
        elseif f == "--log-opt" then local k, x = v:match("^([^=]*)=(.*)$"); h.LogConfig.Config[k] = x
        elseif f == "--name" or f == "--pull" then -- the query's name; never pulls
        else error("unread flag " .. f) end
      end
    end
    return b
  end

  for _, case in ipairs(RICH) do
    it("the rich " .. case[1] .. " container: the CLI argv sets every field of the body, NetworkDisabled aside", function()
      local logcfg = rich_container.check(case[2], case[3])
      local body = json.plain(json.decode(golden["rich_" .. case[1] .. "_body"]))
      assert.is_true(body.NetworkDisabled)
      body.NetworkDisabled = nil   -- no CLI flag; NetworkMode none is
      local argv = rich.argv(case[2], logcfg, "/run/env")
      assert.are.equal("create", argv[1])
      assert.are.same(body, as_body(argv, rich.env_file(case[2])))
    end)
  end

  it("a label key holding '=' is refused by the CLI rendering (never split at the wrong '='), not by the body", function()
    local s = rich_spec { labelChannel = "x=y" }
    local logcfg = rich_container.check(s, nil)
    assert.has_error(function() cli.new { binary = "docker" }:render_lasting(s, logcfg) end,
      "Invalid container specification")
    local body = json.decode(engine.new { socket = "/nonexistent" }:render_lasting(s, logcfg).rendered)
    assert.are.equal("discord:party \u{e9}", body.Labels["x=y"])
  end)
end)
