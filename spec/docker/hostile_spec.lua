-- docker/hostile_spec.lua: the hostile-guest review's attacks, kept as
-- regressions against the real daemon (shared/spec/hardening.md, behaviours
-- 1-8). Every attack runs while a bystander channel's real turn runs too,
-- and that turn must succeed; after each one runRoot is empty, no container
-- of the installation remains, and the attacked channel works again without
-- an operator, except where its quota says an operator must free space (and
-- the reason says so).
--
-- The hostile workers are FROM-scratch images of
-- spec/fixtures/hostile/attack.c (pi-roundtable-sandbox-test/harden-<mode>),
-- chosen per turn by a driver wrapper (a trusted seam) from the message
-- text; the bystanders run the real worker image, built from this tree as
-- pi-roundtable-sandbox-test/harden-worker:<tag> (or SBX_TEST_IMAGE), against
-- a fake model on loopback. The disk
-- case needs a small loop filesystem the service account owns, given as
-- SBX_TEST_LOOPFS (scripts/check.sh makes one as root; the case fails
-- without it). Opt-in with SANDBOX_DOCKER_TEST=1.
local async = require "sandbox.async"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local runtime = require "sandbox.runtime"
local sandbox = require "sandbox"
local seccomp = require "sandbox.runtime._seccomp"
local D = require "docker_runtime"
local probe_images = require "probe_images"
local spec_fs = require "spec_fs"

local ENABLED = os.getenv("SANDBOX_DOCKER_TEST") == "1"
local IMAGE                  -- the real worker's image (setup)
local LOOPFS = os.getenv("SBX_TEST_LOOPFS")
local KEY = "hostile-spec-key"
local TAG = core.random_hex(4)
local MODES = { "syscalls", "connections", "fill", "amplify" }
local SPEAKER = { id = "guest", name = "Guest", principalId = "p_guest" }
local MIB = 1048576

local q = spec_fs.q
local function sh(cmd) return spec_fs.run(cmd .. " 2>&1") end

if not ENABLED then
  describe("hostile guests on real Docker", function()
    pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker specs (make check does)")
  end)
  return
end

describe("hostile guests on real Docker", function()
  local root, server, rt, cli
  local images = {}
  local delay_ms = 0
  local roots = {}

  -- The fake model. SQUAT:<n> asks memory_set for speaker keys k1..k<n>,
  -- eight per reply, then answers how many were saved and refused; any other
  -- text gets "bystander ok".
  local function answer(body)
    local msgs = body.messages
    local last_user = ""
    local saved, refused, asked = 0, 0, 0
    for _, m in ipairs(msgs) do
      if m.role == "user" then last_user = m.content end
      if m.role == "tool" then
        if m.content == "Saved." then saved = saved + 1 else refused = refused + 1 end
      end
      if m.role == "assistant" and m.tool_calls then asked = asked + #m.tool_calls end
    end
    local n = tonumber(last_user:match("SQUAT:(%d+)"))
    if n and asked < n then
      local calls = json.array {}
      for i = asked + 1, math.min(n, asked + 8) do
        local args = json.encode(json.object({ "scope", "key", "text" }, { scope = "speaker", key = "k" .. i, text = "x" }))
        calls[#calls + 1] = json.object({ "id", "type", "function" }, { id = "c" .. i, type = "function",
          ["function"] = json.object({ "name", "arguments" }, { name = "memory_set", arguments = args }) })
      end
      return { tool_calls = calls }
    end
    if n then return { content = string.format("saved=%d refused=%d", saved, refused) } end
    return { content = "bystander ok" }
  end

  local function driver_for(d)
    return {
      run = function(_, spec, turn, signal, report)   -- report: what the host observed (exit, ...)
        local mode = turn.text and turn.text:match("ATTACK:(%a+)")
        if mode then spec.image = assert(images[mode]) end
        return d:run(spec, turn, signal, report)
      end,
      list = function(_, ...) return d:list(...) end,
      remove = function(_, ...) return d:remove(...) end,
    }
  end

  -- The operator lines go to `sink` while a case sets one (the logger
  -- option, operations.md 2), else nowhere.
  local sink
  local logger = {}
  for _, level in ipairs { "debug", "info", "warn", "error" } do
    logger[level] = function(msg, fields) if sink then sink(level, msg, fields or {}) end end
  end

  local function new_runtime(base, over)
    local o = {
      image = IMAGE, runRoot = base .. "/run", workspaceRoot = base .. "/work",
      model = "fake-model", modelUrl = server:url("/v1/chat/completions"),
      apiKey = function() return KEY end, allowHttp = true, driver = driver_for(cli), logger = logger,
      runtime = D.name,
    }
    for k, v in pairs(over or {}) do o[k] = v end
    return runtime.new(o)
  end

  setup(function()
    root = spec_fs.tmpdir("sb-hostile", roots, spec_fs.short_tmp())
    local own
    IMAGE, own = probe_images.worker(root, "pi-roundtable-sandbox-test/harden-worker:" .. TAG)
    images = probe_images.build(root, "spec/fixtures/hostile/attack.c", MODES,
      function(mode) return "pi-roundtable-sandbox-test/harden-" .. mode .. ":" .. TAG end)
    for _, name in ipairs(own) do images.worker = name end      -- removed with the probes
    server = assert(core.http_server {
      on_request = function(req)
        local body = json.decode(req.body or "")
        local function respond()
          if req.headers.authorization ~= "Bearer " .. KEY or not body then return req:reply(401, "{}") end
          local msg = answer(body)
          msg.role = "assistant"
          req:reply(200, json.encode { choices = json.array { { message = msg } } })
        end
        if delay_ms > 0 then core.timer(delay_ms, respond) else respond() end
      end,
    })
    cli = require("sandbox.drivers.cli") { binary = "docker" }
    rt = new_runtime(root)
  end)

  teardown(function()
    if rt then async.run(function() rt:dispose() end) end
    if server then server:close() end
    probe_images.remove(images)
    for _, r in ipairs(roots) do os.execute("rm -rf " .. q(r)) end
  end)

  local function labelled(r)
    return sh("docker ps -aq --filter label=roundtable.sandbox.installation=" .. (r or rt).installation)
  end

  -- Runs attack() and a bystander's real turn at the same time; the
  -- bystander must succeed. Returns what attack returned.
  local function with_bystander(r, channel, attack)
    return async.run(function()
      local a = async.spawn(attack)
      local b = async.spawn(function() return pcall(r.run_turn, r, channel, SPEAKER, "Hello") end)
      local _, bok, reply = async.wait(b)
      assert.is_true(bok, tostring(reply))
      assert.is_true(reply.ok, reply.reason)
      assert.equal("bystander ok", reply.text)
      local ok, res = async.wait(a)
      assert.is_true(ok, tostring(res))
      return res
    end)
  end

  -- One turn inside a task: run_turn's result (operations.md 1: ok, reason,
  -- error, fix), or {raised = the error} for a turn that never started.
  local function try(r, channel, text)
    local ok, res = pcall(r.run_turn, r, channel, SPEAKER, text)
    if not ok then return { raised = res } end
    return res
  end

  -- A result that failed with `reason` and its catalogue message.
  local function failed(res, reason, message)
    assert.is_nil(res.raised)
    assert.is_false(res.ok)
    assert.equal(reason, res.reason)
    assert.equal(message, res.error)
  end

  local function turn(r, channel, text) return async.run(try, r, channel, text) end

  -- After an attack: nothing in runRoot, no container left.
  local function clean(r, base)
    assert.same({}, core.fs_readdir((base or root) .. "/run"))
    assert.equal("", labelled(r))
  end

  it("gets EPERM for every never-allowed system call and mode bit (behaviour 1)", function()
    local res = with_bystander(rt, "fake:bystander-syscalls", function()
      return try(rt, "fake:syscalls", "ATTACK:syscalls")
    end)
    assert.is_true(res.ok, res.reason or res.raised)
    local seen = 0
    for name, e in res.text:gmatch("([%w_]+)=(%d+)") do
      seen = seen + 1
      if name:match("^control_") then
        assert.equal("0", e, name .. " should work")
      else
        assert.equal("1", e, name .. " should fail with EPERM")
      end
    end
    assert.is_true(seen > 60, res.text)
    clean()
    assert.is_true(turn(rt, "fake:syscalls", "Hello").ok)
    clean()
  end)

  it("holds no bystander turn back while six channels hold 16 connections each at RLIMIT_NOFILE 120 (behaviour 2)", function()
    local base = spec_fs.tmpdir("sb-fds", roots, spec_fs.short_tmp())
    local out = sh(string.format("sh -c 'ulimit -S -n 120; ulimit -H -n 120; exec lua5.4 spec/docker/fd_starvation.lua %s %s %s'",
      q(base), q(IMAGE), q(images.connections)))
    local line = out:match("({.*})%s*$")
    assert.truthy(line, out)
    local r = json.decode(line)
    assert.equal(120, r.limit)
    assert.is_true(r.pooled > 0, line)
    assert.equal(8, #r.bystanders)
    for i = 1, 8 do assert.equal("bystander ok", r.bystanders[i], line) end
    for i = 1, 6 do assert.equal("stopped", r.hostile[i], line) end
    assert.equal("bystander ok", r.recovered, line)
    assert.equal(0, r.leftovers, line)
    assert.equal("", sh("docker ps -aq --filter label=roundtable.sandbox.installation=" .. r.installation))
  end)

  it("runs the worker under the profile: the live container's SecurityOpt holds it (behaviour 1)", function()
    local info
    local res = with_bystander(rt, "fake:bystander-inspect", function()
      local t = async.spawn(function() return pcall(rt.run_turn, rt, "fake:inspect", SPEAKER, "ATTACK:connections") end)
      for _ = 1, 200 do
        local names = labelled()
        local id = names:match("^(%x+)")
        if id and not info then
          local r = cli:exec({ "inspect", id }, { max_stdout = 4 * MIB, max_stderr = 65536, kill_after_ms = 10000 })
          if r.exit_status == 0 then
            local all = json.decode(r.stdout)
            for _, c in ipairs(all) do
              if c.Config.Image == images.connections then info = c end
            end
          end
        end
        if info then break end
        async.sleep(50)
      end
      rt:stop("fake:inspect")
      local _, ok, r = async.wait(t)
      assert.is_true(ok, tostring(r))
      return r
    end)
    failed(res, "stopped", runtime.STOPPED)
    assert.truthy(info, "the hostile container was never seen")
    local opts = info.HostConfig.SecurityOpt
    assert.equal("no-new-privileges:true", opts[1])
    local inline = assert(opts[2]:match("^seccomp=(.*)$"))
    assert.same(json.plain(json.decode(assert(spec_fs.read(seccomp.default_path())))), json.plain(json.decode(inline)))
    clean()
  end)

  it("refuses the amplifying 2 MiB [{},...] stdout before building it, host memory within 4x the cap (behaviour 7)", function()
    local grew, res = probe_images.peak_growth(function() return turn(rt, "fake:amplify", "ATTACK:amplify") end)
    failed(res, "invalid_reply", errors.REPLY)
    assert.is_true(grew <= 4 * 2097152, string.format("peak grew by %.1f MiB", grew / MIB))
    -- and again with a bystander at the same time
    res = with_bystander(rt, "fake:bystander-amplify", function() return try(rt, "fake:amplify", "ATTACK:amplify") end)
    failed(res, "invalid_reply", errors.REPLY)
    clean()
    assert.is_true(turn(rt, "fake:amplify", "Hello").ok)
  end)

  it("refuses a speaker's 33rd key while another speaker still saves (behaviour 5)", function()
    local mallory = { id = "mallory", name = "M", principalId = "p_m" }
    local res = with_bystander(rt, "fake:bystander-squat", function()
      return rt:run_turn("fake:squat", mallory, "SQUAT:40")
    end)
    assert.is_true(res.ok, res.reason)
    assert.equal("saved=32 refused=8", res.text)
    -- another speaker of the same channel still saves; mallory replaces
    -- her own 32 keys but still gets no 33rd
    assert.equal("saved=1 refused=0", turn(rt, "fake:squat", "SQUAT:1").text)
    assert.equal("saved=32 refused=1", async.run(function()
      return rt:run_turn("fake:squat", mallory, "SQUAT:33")
    end).text)
    clean()
  end)

  if D.name == "runsc" then
    pending("under runsc, a planted FIFO store (behaviour 8): gVisor's gofer refuses host FIFOs (EPERM on lstat, "
      .. "open, rename), so the worker fails the turn closed (memory_store) instead of moving it aside; a guest "
      .. "cannot plant one (a FIFO made under runsc never reaches the host workspace)")
  end

  it("moves a planted FIFO, directory or garbage store aside and the turn succeeds (behaviour 8)", function()
    local plants = {
      fifo = function(p) os.execute("mkfifo " .. q(p)) end,
      dir = function(p) os.execute("mkdir -p " .. q(p .. "/inside")) end,
      garbage = function(p) spec_fs.write(p, "\0\1garbage{") end,
    }
    if D.name == "runsc" then
      -- gVisor's gofer refuses every operation on a host FIFO (lstat, open
      -- and rename give EPERM), so the worker cannot move one aside; it fails
      -- closed (memory_store) without blocking. Nor can a guest plant one:
      -- a FIFO made under runsc lives in the sandbox only and never reaches
      -- the host workspace. The FIFO case is the case below, pending here.
      plants.fifo = nil
    end
    local lines = {}
    sink = function(level, msg, fields) lines[#lines + 1] = { level, msg, fields } end
    local ok, err = pcall(function()
      for _, store in ipairs { "memory.json", "history.json" } do
        for kind, plant in pairs(plants) do
          local channel = "fake:plant-" .. kind .. "-" .. store:match("^(%a+)")
          local ws = root .. "/work/" .. core.sha256_hex(channel)
          os.execute("mkdir -p -m 0700 " .. q(ws))
          plant(ws .. "/" .. store)
          local res = with_bystander(rt, "fake:bystander-plant", function() return try(rt, channel, "Hello") end)
          assert.is_true(res.ok, channel .. ": " .. tostring(res.reason or res.raised))
          assert.equal("ok", res.reason)                       -- a repaired store is no failure
          assert.equal("bystander ok", res.text)
          local aside = 0
          for _, name in ipairs(core.fs_readdir(ws)) do
            if name:find(store .. ".invalid-", 1, true) == 1 then aside = aside + 1 end
          end
          assert.equal(1, aside, channel)
          assert.is_true(turn(rt, channel, "Hello").ok)          -- and the next turn too
        end
      end
    end)
    sink = nil
    assert(ok, err)
    local reasons = {}
    for _, l in ipairs(lines) do
      if l[2] == runtime.LOG_REPAIRED then
        assert.equal("warn", l[1])
        reasons[l[3].reason] = (reasons[l[3].reason] or 0) + 1
      end
    end
    local kinds = 0
    for _ in pairs(plants) do kinds = kinds + 1 end
    assert.same({ memory_store = kinds, history = kinds }, reasons)
    clean()
  end)

  it("refuses the ninth queued mention and the third of one speaker; off waits for at most the bound (behaviour 4)", function()
    local base = spec_fs.tmpdir("sb-queue", roots, spec_fs.short_tmp())
    local app = sandbox {
      image = IMAGE, runRoot = base .. "/run", workspaceRoot = base .. "/work", stateFile = base .. "/state/c.json",
      model = "fake-model", modelUrl = server:url("/v1/chat/completions"), apiKey = function() return KEY end,
      allowHttp = true, driver = driver_for(cli), initialChannels = { "discord:1", "discord:2" },
      runtime = D.name,
    }
    local function mention(channel, author, text)
      return { type = "message", channelId = channel, guildId = "9", author = { id = author, name = author },
        mentionsBot = true, text = text }
    end
    local MEMBER = { tier = "member", principalId = "p" }
    delay_ms = 1500
    local results, order = {}, {}
    local ok, err = pcall(async.run, function()
      app:start {}
      local tasks = {}
      local function send(channel, author, text)
        tasks[#tasks + 1] = async.spawn(function()
          local r = app:handle(mention(channel, author, text), MEMBER)
          results[text] = r
          order[#order + 1] = text
        end)
      end
      send("1", "flooder", "f1")
      spec_fs.wait_for(function() return #app:status().busy == 1 end, "the first turn")
      send("1", "flooder", "f2")
      send("1", "flooder", "f3")
      send("1", "flooder", "f4")                               -- third queued of one speaker
      for i = 1, 6 do send("1", "g" .. i, "g" .. i) end        -- 2 + 6 = 8 queued
      send("1", "late", "ninth")                               -- the ninth queued
      local off = async.spawn(function()
        local r = app:command({ type = "command", surface = "discord", channelId = "1", guildId = "9",
          author = { id = "owner", name = "O" }, command = "roundtable", group = "sandbox", subcommand = "off" },
          { tier = "owner", principalId = "owner" })
        order[#order + 1] = "off"
        return r
      end)
      -- a bystander channel runs meanwhile
      local by = app:handle(mention("2", "bystander", "Hello"), MEMBER)
      assert.same({ "bystander ok" }, by.replies)
      for _, t in ipairs(tasks) do async.wait(t) end
      async.wait(off)
      app:dispose()
    end)
    delay_ms = 0
    assert(ok, err)
    assert.same({ "The sandbox is busy; try again shortly." }, results.f4.replies)
    assert.same({ "The sandbox is busy; try again shortly." }, results.ninth.replies)
    for _, t in ipairs { "f1", "f2", "f3", "g1", "g6" } do assert.same({ "bystander ok" }, results[t].replies, t) end
    assert.equal("off", order[#order])                         -- after the bounded work queued before it
    assert.same({}, core.fs_readdir(base .. "/run"))
  end)

  it("stops a turn filling a small shared filesystem; other channels keep working; nothing is lost (behaviour 3)", function()
    assert.truthy(LOOPFS, "SBX_TEST_LOOPFS must name a small loop filesystem owned by this account (make check makes one as root)")
    local base = LOOPFS .. "/hs-" .. TAG
    os.execute("mkdir -p -m 0700 " .. q(base))
    roots[#roots + 1] = base
    local total = core.fs_statfs(LOOPFS).total
    local r2 = new_runtime(base, { workspaceQuotaMb = 16, diskReserveMb = 32 })
    local ok, err = pcall(function()
      local res = with_bystander(r2, "fake:bystander-fill", function() return try(r2, "fake:fill", "ATTACK:fill") end)
      failed(res, "workspace_quota", errors.WORKSPACE_QUOTA)
      -- stopped past its quota before it took the reserve the other channels need
      -- (hardening.md 3). How far past is not the page's to promise: the look
      -- comes within _disk.tick_delay, but the container writes on (at up to
      -- ~4 GiB/s into the page cache) until Docker has removed it, tens of ms.
      local written = core.fs_stat(base .. "/work/" .. core.sha256_hex("fake:fill") .. "/fill")
      assert.is_true(written ~= nil and written.size > 16 * MIB)
      local left = core.fs_statfs(LOOPFS).free
      assert.is_true(left >= 32 * MIB, string.format("%d MiB left of %d", left // MIB, total // MIB))
      clean(r2, base)
      -- the channel stays refused until an operator frees space; the reason says so
      res = turn(r2, "fake:fill", "Hello")
      failed(res, "workspace_quota", errors.WORKSPACE_QUOTA)
      assert.matches("an operator must free space in this channel's workspace", res.fix, 1, true)
      -- every other channel keeps working
      assert.is_true(turn(r2, "fake:other", "Hello").ok)
      local ws = base .. "/work/" .. core.sha256_hex("fake:fill")
      os.remove(ws .. "/fill")                                   -- the operator frees it
      os.execute("sync")
      assert.is_true(turn(r2, "fake:fill", "Hello").ok)
      -- below the reserve, every turn is refused with disk_low
      local free = core.fs_statfs(LOOPFS).free
      local filler = base .. "/filler"
      sh(string.format("dd if=/dev/zero of=%s bs=1M count=%d", q(filler), math.max(1, (free - 16 * MIB) // MIB)))
      res = turn(r2, "fake:other", "Hello")
      failed(res, "disk_low", errors.DISK_LOW)
      assert.matches("an operator must free space", res.fix, 1, true)
      -- a state write on a full filesystem loses nothing (filled to the last
      -- block: ext4 refuses large writes before the small ones)
      local store = require("sandbox.channels").open { stateFile = base .. "/state.json", initialChannels = { "fake:a" } }
      sh(string.format("(dd if=/dev/zero of=%s bs=1M; dd if=/dev/zero of=%s bs=4k)", q(filler .. "2"), q(filler .. "3")))
      local before = spec_fs.read(base .. "/state.json")
      local lines = {}
      store.log = function(level, msg, fields) lines[#lines + 1] = { level, msg, fields } end
      local sok, serr = pcall(store.enable, store, "fake:" .. string.rep("b", 200))
      assert.is_false(sok)
      assert.equal(errors.STATE_SAVE, serr)
      assert.same({ "fake:a" }, store:list())
      assert.equal(before, spec_fs.read(base .. "/state.json"))
      assert.equal("state_write_failed", lines[1][3].reason)
      assert.equal("ENOSPC", lines[1][3].errno)
      assert.equal(errors.reason_fix("state_write_failed"), lines[1][3].fix)
      os.remove(filler)
      os.remove(filler .. "2")
      os.remove(filler .. "3")
      -- ext4 reuses freed blocks once its journal commits: sync, then wait for them
      os.execute("sync")
      for _ = 1, 100 do
        if core.fs_statfs(LOOPFS).free > 64 * MIB then break end
        os.execute("sleep 0.1")
      end
      assert.is_true(store:enable("fake:c"))
      assert.is_true(turn(r2, "fake:other", "Hello").ok)
      assert.is_true(total > 0)
    end)
    async.run(function() r2:dispose() end)
    assert(ok, err)
    clean(r2, base)
  end)
end)
