-- driver_cli_spec.lua: the CLI container driver against a fake `docker`
-- (a shell script in a private temp dir, passed as binary=) that records its
-- argv, environment and stdin per call and answers as scripted
-- (spec/runtime.md 4.5-4.8, 8.3-8.4; behaviours 13, 17-26; broker.md 20).
local async = require "sandbox.async"
local cli = require "sandbox.drivers.cli"
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local signal = require "sandbox.signal"
local spec_fs = require "spec_fs"

local CLEANUP = "sandbox container cleanup failed; inspect this installation's containers"

local write, read = spec_fs.write, spec_fs.read

-- The fake: every call N (1, 2, ...) records calls/N.argv (one element per
-- line), calls/N.env and calls/N.stdin. Per command (run, rm, ps) the
-- answer comes from files <cmd>.<k>.{out,err,exit,sleep} for its k-th call,
-- falling back to <cmd>.{out,err,exit,sleep}. The file after --env-file,
-- when there is one, is copied to calls/N.envfile. "sleep" execs `sleep` (so a
-- SIGKILL ends the process and its pipes at once); "outbytes"/"errbytes"
-- write that many bytes.
local FAKE = [[#!/bin/sh
D=$(dirname "$0")
n=$(cat "$D/count" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$D/count"
for a in "$@"; do printf '%s\n' "$a"; done > "$D/calls/$n.argv"
prev=; for a in "$@"; do [ "$prev" = "--env-file" ] && cp "$a" "$D/calls/$n.envfile"; prev=$a; done
env > "$D/calls/$n.env"
cmd=$1
k=$(cat "$D/$cmd.count" 2>/dev/null || echo 0); k=$((k+1)); echo $k > "$D/$cmd.count"
cat > "$D/calls/$n.stdin"
pick() { if [ -e "$D/$cmd.$k.$1" ]; then echo "$D/$cmd.$k.$1"; elif [ -e "$D/$cmd.$1" ]; then echo "$D/$cmd.$1"; fi; }
f=$(pick outbytes); [ -n "$f" ] && head -c "$(cat "$f")" /dev/zero
f=$(pick errbytes); [ -n "$f" ] && head -c "$(cat "$f")" /dev/zero >&2
f=$(pick out); [ -n "$f" ] && cat "$f"
f=$(pick err); [ -n "$f" ] && cat "$f" >&2
f=$(pick sleep); [ -n "$f" ] && exec sleep "$(cat "$f")"
f=$(pick exit); [ -n "$f" ] && exit "$(cat "$f")"
exit 0
]]

local Fake = {}
Fake.__index = Fake

local function new_fake()
  local dir = spec_fs.tmpdir("sbx-spec")
  os.execute("mkdir -p '" .. dir .. "/calls' '" .. dir .. "/run' '" .. dir .. "/ws'")
  write(dir .. "/docker", FAKE)
  os.execute("chmod 700 '" .. dir .. "/docker'")
  return setmetatable({ dir = dir, binary = dir .. "/docker" }, Fake)
end

function Fake:set(file, value) write(self.dir .. "/" .. file, tostring(value)) end

function Fake:calls()
  local n = tonumber(read(self.dir .. "/count") or "0")
  local out = {}
  for i = 1, n do
    local argv = {}
    for line in read(self.dir .. "/calls/" .. i .. ".argv"):gmatch("([^\n]*)\n") do argv[#argv + 1] = line end
    local env = {}
    for line in read(self.dir .. "/calls/" .. i .. ".env"):gmatch("([^\n]*)\n") do env[#env + 1] = line end
    out[i] = { argv = argv, env = env, stdin = read(self.dir .. "/calls/" .. i .. ".stdin") }
  end
  return out
end

function Fake:count(cmd)
  local n = 0
  for _, c in ipairs(self:calls()) do if c.argv[1] == cmd then n = n + 1 end end
  return n
end

function Fake:cleanup() spec_fs.rmdir(self.dir, "sbx-spec") end

local INST = string.rep("a", 64)
local OWNER = "0f8fad5b-d9cb-469f-a165-70867728950e:1234:5678"

local function spec_for(fake, name)
  return {
    name = name or "roundtable-sandbox-0123456789abcdef-89abcdef",
    image = "pi-roundtable-sandbox:local",
    runDir = fake.dir .. "/run", workspaceDir = fake.dir .. "/ws",
    uid = 1000, gid = 1000, memoryMb = 512, cpus = 1, pids = 64,
    labels = container.labels(INST, OWNER),
  }
end

local TURN = { text = "hello", speaker = { id = "guest", name = "Guest" }, model = "fake",
  prompt = "Use the supplied tools", timeZone = "Asia/Taipei", reset = false, tools = {}, mcp = {} }

-- Runs d:run in a task; returns ok, result-or-error, elapsed ms.
local function run(d, spec, sig)
  return async.run(function()
    local t0 = core.now()
    local ok, res = pcall(d.run, d, spec, TURN, sig)
    return ok, res, core.now() - t0
  end)
end

local function driver(fake, opts)
  opts = opts or {}
  opts.binary = fake.binary
  opts.getenv = opts.getenv or function(k)
    return ({ PATH = "/usr/bin:/bin", HOME = "/home/test", SECRET_TOKEN = "s3cret",
      OPENAI_API_KEY = "sk-live" })[k]
  end
  return cli(opts)
end

describe("driver:run", function()
  local fake
  before_each(function() fake = new_fake() end)
  after_each(function() fake:cleanup() end)

  it("passes the 4.3 argv, the compact turn on stdin and returns only {ok, text}", function()
    fake:set("run.out", '{"ok":true,"text":"Done.","truncated":false}')
    local ok, res = run(driver(fake), spec_for(fake))
    assert.is_true(ok, tostring(res))
    assert.same({ ok = true, text = "Done." }, res)
    local calls = fake:calls()
    assert.equal(2, #calls)
    assert.same(container.args(spec_for(fake)), calls[1].argv)
    assert.equal(#container.args(spec_for(fake)), #calls[1].argv)
    assert.equal('{"text":"hello","speaker":{"id":"guest","name":"Guest"},"model":"fake",'
      .. '"prompt":"Use the supplied tools","timeZone":"Asia/Taipei","reset":false,"tools":[],"mcp":[]}',
      calls[1].stdin)
    assert.same({ "rm", "--force", spec_for(fake).name }, calls[2].argv)
    assert.equal("", calls[2].stdin)
  end)

  it("gives every docker child only PATH, HOME and DOCKER_CONTEXT=default (26)", function()
    fake:set("run.out", '{"ok":true,"text":"x"}')
    run(driver(fake), spec_for(fake))
    for _, c in ipairs(fake:calls()) do
      local env = {}
      for _, l in ipairs(c.env) do
        local k = l:match("^([^=]+)=")
        -- the shell itself adds PWD (and SHLVL, _ on some shells)
        if k ~= "PWD" and k ~= "SHLVL" and k ~= "_" then env[#env + 1] = l end
      end
      table.sort(env)
      assert.same({ "DOCKER_CONTEXT=default", "HOME=/home/test", "PATH=/usr/bin:/bin" }, env)
    end
  end)

  it("passes DOCKER_HOST and DOCKER_CONFIG when set, without DOCKER_CONTEXT", function()
    local env = cli.environment(function(k)
      return ({ PATH = "/p", DOCKER_HOST = "unix:///run/d.sock", DOCKER_CONFIG = "/cfg", AWS_SECRET = "x" })[k]
    end)
    assert.same({ "PATH=/p", "DOCKER_CONFIG=/cfg", "DOCKER_HOST=unix:///run/d.sock" }, env)
    assert.is_true(cli.local_endpoint(nil))
    assert.is_true(cli.local_endpoint("unix:///var/run/docker.sock"))
    assert.is_false(cli.local_endpoint("tcp://10.0.0.1:2375"))
    assert.is_false(cli.local_endpoint("unix://relative.sock"))
    local d = cli { getenv = function(k) return k == "DOCKER_HOST" and "tcp://h:1" or nil end }
    assert.has_error(function() d:check_endpoint() end, "remote Docker daemons are unsupported")
  end)

  it("exit 0 causes exactly one removal (21)", function()
    fake:set("run.out", '{"ok":false,"text":"The sandbox turn reached its model-call limit."}')
    local ok, res = run(driver(fake), spec_for(fake))
    assert.is_true(ok)
    assert.same({ ok = false, text = "The sandbox turn reached its model-call limit." }, res)
    assert.equal(1, fake:count("rm"))
  end)

  it("a non-zero exit fails with sandbox worker failed even with a valid reply, and removes twice 100 ms apart (21, 24)", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("run.exit", 1)
    local ok, err = run(driver(fake), spec_for(fake))
    assert.is_false(ok)
    assert.equal("sandbox worker failed", err)
    assert.equal(2, fake:count("rm"))
  end)

  it("docker's own failure (125) is sandbox worker failed", function()
    fake:set("run.err", "Unable to find image 'x' locally\n")
    fake:set("run.exit", 125)
    local ok, err = run(driver(fake), spec_for(fake))
    assert.is_false(ok)
    assert.equal("sandbox worker failed", err)
  end)

  it("retries 'already in progress' and counts 'No such container' as removed (17; broker.md 20)", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("rm.1.err", "Error response from daemon: removal of container x is already in progress\n")
    fake:set("rm.1.exit", 1)
    fake:set("rm.2.err", "Error: No such container: x\n")
    fake:set("rm.2.exit", 1)
    local ok, res = run(driver(fake), spec_for(fake))
    assert.is_true(ok, tostring(res))
    assert.same({ ok = true, text = "Done." }, res)
    assert.equal(2, fake:count("rm"))
  end)

  it("matches 'removal ... already in progress' across lines and case", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("rm.1.err", "Error: REMOVAL of container\nx is Already In Progress\n")
    fake:set("rm.1.exit", 1)
    local ok = run(driver(fake), spec_for(fake))
    assert.is_true(ok)
    assert.equal(2, fake:count("rm"))
  end)

  it("another rm error fails with the cleanup error after one attempt, replacing a good reply (18)", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("rm.err", "Error response from daemon: permission denied\n")
    fake:set("rm.exit", 1)
    local ok, err = run(driver(fake), spec_for(fake))
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.equal(1, fake:count("rm"))
  end)

  it("three 'already in progress' answers give the cleanup error after exactly three attempts (20)", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("rm.err", "removal of container x is already in progress\n")
    fake:set("rm.exit", 1)
    local ok, err, ms = run(driver(fake), spec_for(fake))
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.equal(3, fake:count("rm"))
    assert.is_true(ms >= 300, "sleeps 100 ms then 200 ms between attempts: " .. ms)
  end)

  it("rm stderr over 16 KiB is a failed attempt that is not retried", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("rm.1.err", "removal of container x is already in progress\n" .. string.rep("x", 16384))
    fake:set("rm.1.exit", 1)
    local ok, err = run(driver(fake), spec_for(fake))
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.equal(1, fake:count("rm"))
  end)

  it("a hanging rm is killed after 5 s and yields the cleanup error (19) #slow", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("rm.sleep", 60)
    local ok, err, ms = run(driver(fake), spec_for(fake))
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.equal(1, fake:count("rm"))
    assert.is_true(ms >= 5000 and ms < 7000, "killed after 5 s: " .. ms)
  end)

  it("an already aborted signal spawns nothing and removes nothing (22)", function()
    local sig = signal.new()
    sig:abort("sandbox turn timed out")
    local ok, err = run(driver(fake), spec_for(fake), sig)
    assert.is_false(ok)
    assert.equal("sandbox turn timed out", err)
    assert.equal(0, #fake:calls())
  end)

  it("an abort SIGKILLs the CLI, raises the reason and removes the name twice (21)", function()
    fake:set("run.sleep", 60)
    local sig = signal.new()
    local ok, err, ms = async.run(function()
      -- abort once the fake has recorded its run call (run.count is written
      -- after its argv), however long a loaded machine takes to start it
      local aborted_at
      async.spawn(function()
        for _ = 1, 3000 do
          if core.fs_lstat(fake.dir .. "/run.count") then break end
          async.sleep(10)
        end
        aborted_at = core.now()
        sig:abort("sandbox turn stopped")
      end)
      local ok, err = pcall(driver(fake).run, driver(fake), spec_for(fake), TURN, sig)
      return ok, err, aborted_at and core.now() - aborted_at or -1
    end)
    assert.is_false(ok)
    assert.equal("sandbox turn stopped", err)
    assert.is_true(ms < 2000, "killed at once: " .. ms)
    local calls = fake:calls()
    assert.equal(3, #calls)
    assert.equal("rm", calls[2].argv[1])
    assert.equal("rm", calls[3].argv[1])
    assert.equal(calls[2].argv[3], calls[3].argv[3])
  end)

  it("an aborted turn never yields a reply even if the worker exited 0", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("run.sleep", 0)
    local sig = signal.new()
    local d = driver(fake)
    local _, ok, err = async.run(function()
      -- abort while the CLI runs; the fake has already printed the reply
      local task = async.spawn(function() return pcall(d.run, d, spec_for(fake), TURN, sig) end)
      sig:abort("sandbox turn timed out")
      return async.wait(task)
    end)
    assert.is_false(ok)
    assert.equal("sandbox turn timed out", err)
  end)

  it("a removal failure after an abort replaces the abort reason", function()
    fake:set("run.sleep", 60)
    fake:set("rm.err", "Cannot connect to the Docker daemon\n")
    fake:set("rm.exit", 1)
    local sig = signal.new()
    local d = driver(fake)
    local ok, err = async.run(function()
      core.timer(100, function() sig:abort("sandbox turn timed out") end)
      return pcall(d.run, d, spec_for(fake), TURN, sig)
    end)
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
  end)

  it("stdout over 2 MiB fails with body too large (23)", function()
    fake:set("run.outbytes", 2097153)
    local ok, err = run(driver(fake), spec_for(fake))
    assert.is_false(ok)
    assert.equal("body too large", err)
  end)

  it("stdout of exactly 2 MiB is read whole (then judged as a reply)", function()
    fake:set("run.outbytes", 2097152)
    local ok, err = run(driver(fake), spec_for(fake))
    assert.is_false(ok)
    assert.equal("invalid sandbox reply", err)
  end)

  it("stderr over 128 KiB fails with body too large (23)", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("run.errbytes", 131073)
    local ok, err = run(driver(fake), spec_for(fake))
    assert.is_false(ok)
    assert.equal("body too large", err)
  end)

  it("stderr up to 128 KiB is discarded", function()
    fake:set("run.out", '{"ok":true,"text":"Done."}')
    fake:set("run.errbytes", 131072)
    local ok, res = run(driver(fake), spec_for(fake))
    assert.is_true(ok, tostring(res))
  end)

  it("a docker binary that cannot be started raises the spawn error and removes nothing", function()
    local d = cli { binary = fake.dir .. "/missing-docker" }
    local ok, err = run(d, spec_for(fake))
    assert.is_false(ok)
    assert.matches("^cannot start .*missing%-docker: no such file or directory$", err)
  end)

  it("raises the 4.2 error before anything runs", function()
    local s = spec_for(fake)
    s.uid = 0
    local ok, err = run(driver(fake), s)
    assert.is_false(ok)
    assert.equal("sandbox requires a non-root user and group", err)
    assert.equal(0, #fake:calls())
  end)
end)

describe("reply parsing (25, 8.3-8.4)", function()
  local parse = cli.parse_reply
  local function bad(s)
    local ok, err = pcall(parse, s)
    assert.is_false(ok, s)
    assert.equal("invalid sandbox reply", err)
  end

  it("refuses non-JSON, invalid UTF-8, a BOM, a missing ok, wrong types and over-long text", function()
    bad("")
    bad("not json")
    bad('{"ok":true,"text":"a\255"}')
    bad("\239\187\191" .. '{"ok":true,"text":"x"}')
    bad('{"text":"x"}')
    bad('{"ok":"true","text":"x"}')
    bad('{"ok":true}')
    bad('{"ok":true,"text":1}')
    bad('[true,"x"]')
    bad('{"ok":true,"text":"x"} {}')
    bad('{"ok":true,"text":"x","ok":false}')
    bad('{"ok":true,"text":"' .. string.rep("a", 100001) .. '"}')
    bad(string.rep("[", 65) .. string.rep("]", 65))
  end)

  it("accepts 100,000 multi-byte characters and the known members only (hardening.md 7)", function()
    local text = string.rep("\u{4e2d}", 100000)
    assert.same({ ok = true, text = text, truncated = true }, parse('{"ok":true,"text":"' .. text .. '","truncated":true}'))
    assert.same({ ok = false, text = "" }, parse(' {"ok":false,"text":""}\n'))
    assert.same({ ok = true, text = "t", reason = "memory_store" }, parse('{"ok":true,"text":"t","reason":"memory_store"}'))
    -- a reason outside the repairs the worker may report is not passed on
    assert.same({ ok = true, text = "t" }, parse('{"ok":true,"text":"t","reason":"deadline"}'))
  end)

  it("refuses an unknown member, or a known one of another kind, before building it (hardening.md 7)", function()
    for _, s in ipairs {
      '{"ok":true,"text":"x","x":[1]}', '{"ok":true,"text":"x","pad":{}}', '{"ok":true,"text":"x","x":1}',
      '{"ok":true,"text":"x","reason":["memory_store"]}', '{"ok":true,"text":"x","truncated":"yes"}',
      '{"ok":true,"text":["x"]}', '{"ok":true,"text":"x","pad":[' .. string.rep("{},", 100000) .. '{}]}',
    } do
      local ok, err = pcall(parse, s)
      assert.is_false(ok)
      assert.equal("invalid sandbox reply", err)
    end
  end)
end)

describe("driver:list and driver:remove", function()
  local fake
  before_each(function() fake = new_fake() end)
  after_each(function() fake:cleanup() end)

  it("lists by the installation label with the 6.3 command", function()
    fake:set("ps.out", "roundtable-sandbox-0123456789abcdef-01234567\t" .. OWNER
      .. "\nother\t\n")
    local d = driver(fake)
    local list = async.run(function() return d:list(INST) end)
    assert.same({
      { name = "roundtable-sandbox-0123456789abcdef-01234567", owner = OWNER },
      { name = "other", owner = "" },
    }, list)
    assert.same({ "ps", "--all", "--no-trunc", "--filter", "label=roundtable.sandbox.installation=" .. INST,
      "--format", '{{.Names}}\\t{{.Label "roundtable.sandbox.owner"}}' }, fake:calls()[1].argv)
  end)

  it("a failed list is the cleanup error", function()
    fake:set("ps.exit", 1)
    local d = driver(fake)
    local ok, err = pcall(async.run, function() return d:list(INST) end)
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
  end)

  it("remove succeeds on exit 0 and refuses a name that could be a flag", function()
    local d = driver(fake)
    async.run(function() d:remove("roundtable-sandbox-0123456789abcdef-01234567") end)
    assert.equal(1, fake:count("rm"))
    local ok, err = pcall(async.run, function() d:remove("--all") end)
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.equal(1, fake:count("rm"))
  end)
end)

-- The long-lived lifecycle through the CLI (drivers/_lasting.lua, rich-mode.md
-- 5.4 with `docker create`, `start`, `container inspect`, `rm`, `logs`), as
-- rich mode drives it: rich.dockerDriver{driver = cli{...}}.
describe("the CLI driver's long-lived lifecycle (rich mode)", function()
  local rich_docker = require "sandbox.rich.docker"
  local rich_render = require "sandbox.drivers._rich"
  local rich_container = require "sandbox.rich._container"
  local NAME = "roundtable-sandbox-discord_party"
  local fake
  before_each(function() fake = new_fake() end)
  after_each(function() fake:cleanup() end)

  local function rspec(over)
    local s = { name = NAME, image = "pi-roundtable-sandbox:pi", channel = "discord:party", profile = "main",
      timeZone = "UTC", labelChannel = "roundtable.sandbox.channel", labelProfile = "roundtable.sandbox.profile",
      runDir = fake.dir .. "/run", workspaceDir = fake.dir .. "/ws", uid = 1000, gid = 1000 }
    for k, v in pairs(over or {}) do s[k] = v end
    return s
  end

  local function inspect_json(running, image, profile)
    return '[{"Id":"abc","State":{"Running":' .. tostring(running) .. ',"Status":"x"},"Config":{"Image":"'
      .. image .. '","Labels":{"roundtable.sandbox.profile":"' .. profile .. '","roundtable.sandbox.channel":"c"}}}]'
  end

  local function rd(opts)
    return rich_docker.new { driver = driver(fake, opts) }
  end

  local function argvs()
    local out = {}
    for i, c in ipairs(fake:calls()) do out[i] = c.argv end
    return out
  end

  local function missing()
    fake:set("container.err", "Error: No such container: " .. NAME .. "\n")
    fake:set("container.exit", 1)
  end

  it("ensureRunning on a missing container: inspect, then docker create of the 5.3 settings, then start", function()
    missing()
    async.run(function() rd().ensureRunning(rspec()) end)
    local spec = rspec()
    local seccomp = require "sandbox.runtime._seccomp"
    spec.seccomp = seccomp.load(seccomp.default_path("rich"))   -- the rich image's own allow-list
    local a = argvs()
    local env_path = a[2][9]
    assert.equal("--env-file", a[2][8])
    assert.same({
      { "container", "inspect", "--", NAME },
      rich_render.argv(spec, rich_container.check(spec, nil), env_path),
      { "start", "--", NAME },
    }, a)
    assert.truthy(table.concat(a[2], " "):find("--security-opt seccomp=" .. spec.seccomp.path, 1, true))
    -- the environment in its file, in the page's order; the file is gone after
    assert.equal(rich_render.env_file(spec), spec_fs.read(fake.dir .. "/calls/2.envfile"))
    assert.is_false(spec_fs.exists(env_path))
    for _, c in ipairs(fake:calls()) do
      local names = {}
      for _, l in ipairs(c.env) do
        local k = l:match("^([^=]+)=")
        if k ~= "PWD" and k ~= "SHLVL" and k ~= "_" then names[#names + 1] = k end
      end
      table.sort(names)
      assert.same({ "DOCKER_CONTEXT", "HOME", "PATH" }, names)
    end
  end)

  it("ensureRunning keeps a running container of the same image and profile: one inspect, nothing else", function()
    fake:set("container.out", inspect_json(true, "pi-roundtable-sandbox:pi", "main"))
    async.run(function() rd().ensureRunning(rspec()) end)
    assert.same({ { "container", "inspect", "--", NAME } }, argvs())
  end)

  for _, case in ipairs {
    { "another profile", inspect_json(true, "pi-roundtable-sandbox:pi", "other") },
    { "another image", inspect_json(true, "pi-roundtable-sandbox:old", "main") },
    { "a stopped one", inspect_json(false, "pi-roundtable-sandbox:pi", "main") },
  } do
    it("ensureRunning replaces " .. case[1] .. ": rm --force, create, start", function()
      fake:set("container.out", case[2])
      async.run(function() rd().ensureRunning(rspec()) end)
      local a = argvs()
      assert.equal(4, #a)
      assert.same({ "rm", "--force", "--", NAME }, a[2])
      assert.equal("create", a[3][1])
      assert.same({ "start", "--", NAME }, a[4])
    end)
  end

  it("status maps inspect to missing, running or stopped with the image and the profile label", function()
    local d = rd()
    missing()
    assert.same({ state = "missing" }, async.run(function() return d.status(NAME) end))
    os.remove(fake.dir .. "/container.exit")
    fake:set("container.out", inspect_json(true, "img:1", "main"))
    assert.same({ state = "running", image = "img:1", profile = "main" },
      async.run(function() return d.status(NAME) end))
    fake:set("container.out", inspect_json(false, "img:1", "main"))
    assert.equal("stopped", async.run(function() return d.status(NAME) end).state)
  end)

  it("a refused command raises docker <command> <name> failed with <status>: <first 300 characters of stderr>", function()
    missing()
    fake:set("create.err", "Error response from daemon: No such image: pi-roundtable-sandbox:pi" .. string.rep("x", 400))
    fake:set("create.exit", 125)
    local ok, err = pcall(async.run, function() rd().ensureRunning(rspec()) end)
    assert.is_false(ok)
    local text = "Error response from daemon: No such image: pi-roundtable-sandbox:pi" .. string.rep("x", 400)
    assert.equal("docker create " .. NAME .. " failed with 125: " .. text:sub(1, 300), err)
    assert.equal(0, fake:count("start"))
    local create = argvs()[2]
    assert.equal("--env-file", create[8])
    assert.is_false(spec_fs.exists(create[9]))   -- the env file is gone on failure too
  end)

  it("an inspect answer that is not one container object is refused, never read as a state", function()
    for _, out in ipairs { "[]", "{}", "not json", '[{"State":{}},{"State":{}}]' } do
      fake:set("container.out", out)
      local ok, err = pcall(async.run, function() return rd().status(NAME) end)
      assert.is_false(ok)
      assert.equal("docker container inspect " .. NAME .. " answered no container", err)
    end
  end)

  it("a command that outlives its deadline is killed and reported as a timeout", function()
    fake:set("container.sleep", 30)
    local ok, err = pcall(async.run, function() return rd { call_timeout_ms = 300 }.status(NAME) end)
    assert.is_false(ok)
    assert.equal("docker container inspect " .. NAME .. " failed: timeout", err)
  end)

  it("a docker binary that cannot start is reported, naming the command", function()
    local d = rich_docker.new { driver = cli { binary = fake.dir .. "/absent-docker",
      getenv = function(k) return ({ PATH = "/usr/bin:/bin" })[k] end } }
    local ok, err = pcall(async.run, function() return d.status(NAME) end)
    assert.is_false(ok)
    assert.is_truthy(err:find("^docker container inspect " .. NAME:gsub("%p", "%%%0") .. " failed: "))
  end)

  it("remove is one rm --force; a missing container is fine, any other failure raises", function()
    missing()
    fake:set("rm.err", "Error: No such container: " .. NAME)
    fake:set("rm.exit", 1)
    async.run(function() rd().remove(NAME) end)
    assert.same({ { "rm", "--force", "--", NAME } }, argvs())
    fake:set("rm.err", "Error response from daemon: removal of container is already in progress")
    local ok, err = pcall(async.run, function() rd().remove(NAME) end)
    assert.is_false(ok)
    assert.equal("docker rm " .. NAME .. " failed with 1: Error response from daemon: removal of container is already in progress", err)
  end)

  it("logs asks docker logs --tail max(1, floor(n)); stdout then stderr; a missing container has none", function()
    fake:set("logs.out", "line one\n")
    fake:set("logs.err", "line two\n")
    assert.equal("line one\nline two\n", async.run(function() return rd().logs(NAME, 7.9) end))
    assert.same({ "logs", "--tail", "7", "--", NAME }, argvs()[1])
    async.run(function() return rd().logs(NAME, -3) end)
    assert.same({ "logs", "--tail", "1", "--", NAME }, argvs()[2])
    os.remove(fake.dir .. "/logs.out")
    fake:set("logs.err", "Error: No such container: " .. NAME)
    fake:set("logs.exit", 1)
    assert.equal("", async.run(function() return rd().logs(NAME, 5) end))
  end)

  it("a name that could be a flag never reaches docker", function()
    for _, name in ipairs { "--all", "-v", "A", "x/y" } do
      for _, op in ipairs { "status", "remove", "logs" } do
        local ok, err = pcall(async.run, function() return rd()[op](name, 3) end)
        assert.is_false(ok)
        assert.equal("Invalid container specification", err)
      end
    end
    assert.equal(0, #fake:calls())
  end)

  it("a CLI driver pointed at a remote daemon is refused when rich mode takes it", function()
    assert.has_error(function()
      rich_docker.new { driver = cli { binary = fake.binary,
        getenv = function(k) return ({ DOCKER_HOST = "tcp://10.0.0.1:2375" })[k] end } }
    end, "remote Docker daemons are unsupported")
  end)

  it("rich mode's driver option takes the CLI driver itself (adapted, with the runtime's profile label)", function()
    local adapted = rich_docker.adapt(driver(fake), "x.profile")
    fake:set("container.out", '[{"State":{"Running":true},"Config":{"Image":"i","Labels":{"x.profile":"p"}}}]')
    assert.same({ state = "running", image = "i", profile = "p" }, async.run(function() return adapted.status(NAME) end))
    local table_driver = { ensureRunning = function() end, status = function() end, remove = function() end }
    assert.equal(table_driver, rich_docker.adapt(table_driver, "x.profile"))
  end)
end)
