-- hardening_spec.lua: a hostile guest must not hurt the other channels
-- (shared/spec/hardening.md, its behaviours list), offline: the runtime and
-- the app with Lua fake drivers over the real broker socket, the core's
-- descriptor budget and disk measures, and child processes for the cases
-- that need their own descriptor limit. The same attacks against real
-- Docker are spec/docker/hostile_spec.lua.
local async = require "sandbox.async"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local runtime = require "sandbox.runtime"
local options = require "sandbox.runtime._options"
local seccomp = require "sandbox.runtime._seccomp"
local reply_text = require "sandbox.channels._reply_text"
local sandbox = require "sandbox"
local fake = require "fake_driver"
local probe_images = require "probe_images"
local spec_fs = require "spec_fs"

local run = async.run
local GUEST = { id = "guest", name = "Guest", principalId = "p_guest" }
local MIB = 1048576

local roots = {}
local function tmproot() return spec_fs.tmpdir("hd", roots, spec_fs.short_tmp()) end
local function service_account() return spec_fs.service_account(pending) end
local sh = spec_fs.sh

local function quiet() end
local QUIET = { debug = quiet, info = quiet, warn = quiet, error = quiet }

local function options_for(root, over)
  local o = {
    logger = QUIET,
    image = "pi-roundtable-sandbox:test", runRoot = root .. "/run", workspaceRoot = root .. "/work",
    model = "fake", modelUrl = "https://models.example/v1/chat/completions",
    apiKey = function() return "k" end, driver = fake.new(fake.reply(true, "done")),
  }
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

local function refusal(fn, opts)
  local ok, err = pcall(fn, opts)
  assert.is_false(ok, "should fail")
  return err
end

-- A `logger` option capturing the operator lines: the logger and its list
-- of {level, msg, fields}.
local function capture()
  local lines, logger = {}, {}
  for level in pairs { debug = 1, info = 1, warn = 1, error = 1 } do
    logger[level] = function(msg, fields) lines[#lines + 1] = { level = level, msg = msg, fields = fields or {} } end
  end
  return logger, lines
end

-- A turn that settled failed with `reason` and the catalogue's `message`.
local function failed(r, reason, message)
  assert.is_table(r)
  assert.is_false(r.ok)
  assert.equal(reason, r.reason)
  if message then assert.equal(message, r.error) end
end

teardown(function()
  for _, r in ipairs(roots) do core.fs_rmtree(r) end
end)

describe("options (hardening.md 1, 3, 4, 6)", function()
  it("resolve to the defaults, with the shipped seccomp profile", function()
    if not service_account() then return end
    local rt = runtime.new(options_for(tmproot()))
    local o = rt.options
    assert.equal(256, o.workspaceQuotaMb)
    assert.equal(1024, o.diskReserveMb)
    assert.equal("neutral", o.mentions)
    assert.equal(100000, o.maxReplyChars)
    assert.equal(seccomp.default_path(), o.seccompProfile)
    assert.is_true(o.seccompCount > 0)
    run(function() rt:dispose() end)
  end)

  it("refuse values outside their ranges, in sandbox{} and sandbox.runtime{}", function()
    local cases = {
      { { workspaceQuotaMb = 0 }, "workspaceQuotaMb must be 1 to 1048576" },
      { { workspaceQuotaMb = 1048577 }, "workspaceQuotaMb must be 1 to 1048576" },
      { { workspaceQuotaMb = "256" }, "workspaceQuotaMb must be 1 to 1048576" },
      { { workspaceQuotaMb = 1.5 }, "workspaceQuotaMb must be 1 to 1048576" },
      { { diskReserveMb = -1 }, "diskReserveMb must be 0 to 1048576" },
      { { mentions = "loud" }, 'mentions must be "neutral" or "allow"' },
      { { maxReplyChars = 0 }, "maxReplyChars must be 1 to 100000" },
      { { maxReplyChars = 100001 }, "maxReplyChars must be 1 to 100000" },
      { { seccompProfile = "relative.json" }, "seccomp profile missing: relative.json" },
    }
    for _, c in ipairs(cases) do
      local o = options_for("/nonexistent-root", c[1])
      assert.equal(c[2], refusal(sandbox, o))
      assert.equal(c[2], refusal(options.check_hardening, o))
    end
    assert.equal("maxQueuedTurns must be 1 to 1000", refusal(sandbox, options_for("/x", { maxQueuedTurns = 0 })))
    assert.equal("maxQueuedTurns must be 1 to 1000", refusal(sandbox, options_for("/x", { maxQueuedTurns = 1001 })))
    if not service_account() then return end
    assert.equal("unknown sandbox option: maxQueuedTurns",
      refusal(runtime.new, options_for(tmproot(), { maxQueuedTurns = 8 })))
  end)

  it("a missing or unreadable seccomp profile fails startup, never falls back (behaviour 1)", function()
    if not service_account() then return end
    local root = tmproot()
    local missing = root .. "/nothing.json"
    assert.equal("seccomp profile missing: " .. missing,
      refusal(runtime.new, options_for(root, { seccompProfile = missing })))
    local unreadable = root .. "/unreadable.json"
    spec_fs.write(unreadable, assert(spec_fs.read(seccomp.default_path())))
    os.execute("chmod 000 '" .. unreadable .. "'")
    assert.equal("seccomp profile missing: " .. unreadable,
      refusal(runtime.new, options_for(root, { seccompProfile = unreadable })))
    local bad = root .. "/bad.json"
    spec_fs.write(bad, "{not json")
    assert.equal("seccomp profile invalid: " .. bad, refusal(runtime.new, options_for(root, { seccompProfile = bad })))
    -- the fix names the shipped file
    assert.matches("worker/seccomp.json", errors.fix("seccomp profile missing: " .. missing), 1, true)
  end)

  it("every container spec carries the profile; its argv has --security-opt seccomp=<path>", function()
    if not service_account() then return end
    local argv
    local d = fake.new(function(spec)
      argv = require("sandbox.drivers._sealed").args(spec)
      return { ok = true, text = "done" }
    end)
    local rt = runtime.new(options_for(tmproot(), { driver = d }))
    run(function() rt:run_turn("fake:a", GUEST, "hi") end)
    local s = d.calls[1].spec
    assert.equal(seccomp.default_path(), s.seccompProfile)
    assert.equal(44, #argv)
    assert.equal("seccomp=" .. s.seccompProfile, argv[23])
    run(function() rt:dispose() end)
  end)
end)

describe("the reply surface (hardening.md 6; behaviour 6)", function()
  local Z = reply_text.ZWSP

  it("neutralises @everyone, @here and <@…>, <@&…>, <#…> tokens unless mentions = allow", function()
    if not service_account() then return end
    local text = "@everyone @here <@123> <@!45> <@&9> <#7> a@b.c <x>"
    local function turn(over)
      local rt = runtime.new(options_for(tmproot(), over))
      local r = run(function() return rt:run_turn("fake:a", GUEST, "hi") end)
      run(function() rt:dispose() end)
      return r.text
    end
    assert.equal("@" .. Z .. "everyone @" .. Z .. "here <" .. Z .. "@123> <" .. Z .. "@!45> <" .. Z .. "@&9> <"
      .. Z .. "#7> a@b.c <x>", turn { driver = fake.new(fake.reply(true, text)) })
    assert.equal(text, turn { driver = fake.new(fake.reply(true, text)), mentions = "allow" })
  end)

  it("the app's reply carries allowedMentions {parse: []} with neutral mentions, none with allow", function()
    if not service_account() then return end
    local function reply(mentions)
      local root = tmproot()
      local app = sandbox {
        image = "pi-roundtable-sandbox:test", runRoot = root .. "/run", workspaceRoot = root .. "/work",
        stateFile = root .. "/state/channels.json", model = "fake", modelUrl = "https://models.example/v1",
        apiKey = function() return "k" end, driver = fake.new(fake.reply(true, "@here")), mentions = mentions,
        initialChannels = { "discord:1" },
      }
      return run(function()
        app:start {}
        local r = app:handle({ type = "message", channelId = "1", guildId = "9", author = { id = "u1", name = "U" },
          mentionsBot = true, text = "hi" }, { tier = "member", principalId = "p1" })
        app:dispose()
        return r
      end)
    end
    local neutral = reply(nil)
    assert.equal("@" .. Z .. "here", neutral.replies[1])
    assert.equal('{"parse":[]}', json.encode(neutral.allowedMentions))
    local allow = reply("allow")
    assert.equal("@here", allow.replies[1])
    assert.is_nil(allow.allowedMentions)
  end)

  it("a reply over maxReplyChars fails the turn as an invalid reply", function()
    if not service_account() then return end
    local rt = runtime.new(options_for(tmproot(), { maxReplyChars = 10,
      driver = fake.new(function(_, turn) return { ok = true, text = turn.text } end) }))
    run(function()
      assert.equal("0123456789", rt:run_turn("fake:a", GUEST, "0123456789").text)
      failed(rt:run_turn("fake:a", GUEST, "0123456789a"), "invalid_reply", "invalid sandbox reply")
      rt:dispose()
    end)
  end)

  it("terminal text: C0 (but \\n and \\t), DEL and C1 become U+FFFD; the rest is kept", function()
    local F = reply_text.REPLACEMENT
    assert.equal("a" .. F .. "b\nc\td" .. F .. F .. "e" .. F .. "f\u{a0}\u{ff}\u{2028}",
      reply_text.terminal("a\0b\nc\td\27\re\127f\u{a0}\u{ff}\u{2028}"))
    assert.equal(F .. F .. F, reply_text.terminal("\u{80}\u{85}\u{9f}"))
    assert.equal("plain", reply_text.terminal("plain"))
  end)
end)

describe("the worker's repaired stores (hardening.md 8)", function()
  it("the host logs the reason at warn and returns the turn's reply", function()
    if not service_account() then return end
    local logger, lines = capture()
    local rt = runtime.new(options_for(tmproot(), { logger = logger,
      driver = fake.new(function() return { ok = true, text = "done", reason = "memory_store" } end) }))
    local reply = run(function() return rt:run_turn("fake:a", GUEST, "hi") end)
    assert.is_true(reply.ok)
    assert.equal("done", reply.text)
    assert.equal("ok", reply.reason)                      -- the turn's reason: the repair is not a failure
    local found
    for _, l in ipairs(lines) do
      if l.msg == runtime.LOG_REPAIRED then found = l end
    end
    assert.truthy(found, "no repair line")
    assert.equal("warn", found.level)
    assert.same({ channel = "fake:a", turn = reply.turn, reason = "memory_store",
      fix = errors.reason_fix("memory_store") }, found.fields)
    run(function() rt:dispose() end)
  end)
end)

describe("bounded queues (hardening.md 4; behaviour 4)", function()
  local function app_with(driver, over)
    local root = tmproot()
    local o = {
      image = "pi-roundtable-sandbox:test", runRoot = root .. "/run", workspaceRoot = root .. "/work",
      stateFile = root .. "/state/channels.json", model = "fake", modelUrl = "https://models.example/v1",
      apiKey = function() return "k" end, driver = driver, initialChannels = { "discord:1" },
    }
    for k, v in pairs(over or {}) do o[k] = v end
    return sandbox(o)
  end
  local function mention(author, text)
    return { type = "message", channelId = "1", guildId = "9", author = { id = author, name = author },
      mentionsBot = true, text = text }
  end
  local MEMBER = { tier = "member", principalId = "p" }

  it("refuses the ninth queued mention of a channel and the third of one speaker with the busy text", function()
    if not service_account() then return end
    local waiting = {}
    local d = fake.new(function(_, turn)
      async.await(function(resume) waiting[#waiting + 1] = resume end)
      return { ok = true, text = "echo " .. turn.text }
    end)
    local app = app_with(d)
    local lines = {}
    local results = {}
    run(function()
      app:start { log = function(level, msg, fields) lines[#lines + 1] = { level, msg, fields } end }
      local tasks = {}
      local function send(author, text)
        tasks[#tasks + 1] = async.spawn(function() results[text] = app:handle(mention(author, text), MEMBER) end)
      end
      send("holder", "running")
      spec_fs.wait_for(function() return #waiting == 1 end, "the first turn")
      -- the running turn is not queued: eight more wait, one speaker two
      send("s1", "s1-a")
      send("s1", "s1-b")
      send("s1", "s1-c")                                  -- the third of one speaker
      for i = 2, 7 do send("s" .. i, "q" .. i) end        -- 2 + 6 = 8 queued
      send("s9", "ninth")                                 -- the ninth queued of the channel
      assert.same({ "The sandbox is busy; try again shortly." }, results["s1-c"].replies)
      assert.same({ "The sandbox is busy; try again shortly." }, results["ninth"].replies)
      while #waiting > 0 or not (results["q7"]) do
        if #waiting > 0 then table.remove(waiting, 1)() else async.sleep(5) end
      end
      for _, t in ipairs(tasks) do async.wait(t) end
      app:dispose()
    end)
    assert.same({ "echo running" }, results.running.replies)
    assert.same({ "echo s1-b" }, results["s1-b"].replies)
    assert.same({ "echo q7" }, results.q7.replies)
    assert.equal(9, #d.calls)
    local refused = 0
    for _, l in ipairs(lines) do
      if l[2] == "turn refused" then
        refused = refused + 1
        assert.equal("warn", l[1])
        assert.same({ channel = "discord:1", reason = "queue_full", fix = errors.reason_fix("queue_full") }, l[3])
      end
    end
    assert.equal(2, refused)
  end)

  it("maxQueuedTurns changes the channel bound", function()
    if not service_account() then return end
    local gate
    local d = fake.new(function()
      async.await(function(resume) gate = resume end)
      return { ok = true, text = "x" }
    end)
    local app = app_with(d, { maxQueuedTurns = 1 })
    run(function()
      app:start {}
      local first = async.spawn(app.handle, app, mention("a", "1"), MEMBER)
      spec_fs.wait_for(function() return gate ~= nil end, "the first turn")
      local second = async.spawn(app.handle, app, mention("b", "2"), MEMBER)
      local third = app:handle(mention("c", "3"), MEMBER)
      assert.same({ "The sandbox is busy; try again shortly." }, third.replies)
      local g = gate
      gate = nil
      g()
      spec_fs.wait_for(function() return gate ~= nil end, "the second turn")
      gate()
      async.wait(first)
      async.wait(second)
      app:dispose()
    end)
  end)
end)

describe("disk (hardening.md 3; behaviour 3)", function()
  local function write_mib(path, n)
    local f = assert(io.open(path, "wb"))
    local block = string.rep("x", MIB)
    for _ = 1, n do f:write(block) end
    f:close()
  end

  it("measures allocated blocks without following links, bounded in entries and depth", function()
    local root = tmproot()
    local ws = root .. "/ws"
    os.execute("mkdir -p '" .. ws .. "/a/b' && truncate -s 10G '" .. ws .. "/sparse' && mkfifo '" .. ws .. "/fifo'")
    write_mib(root .. "/outside", 3)
    os.execute("ln -s '" .. root .. "/outside' '" .. ws .. "/link' && ln -s '" .. root .. "' '" .. ws .. "/a/up'")
    write_mib(ws .. "/a/b/one", 1)
    local r = core.fs_usage(ws, 1000)
    assert.is_true(r.complete)
    assert.equal(7, r.entries)                            -- a, b, one, sparse, fifo, link, up
    assert.is_true(r.bytes >= MIB and r.bytes < 2 * MIB, tostring(r.bytes))
    -- the same in the threadpool; a cap on entries makes it incomplete
    local a = run(function() return async.await(function(resume) core.fs_usage(ws, 1000, resume) end) end)
    assert.same(r, a)
    assert.is_false(core.fs_usage(ws, 3).complete)
    -- deeper than 64 levels: incomplete, whatever the entries
    local deep = root .. "/deep"
    os.execute("mkdir -p '" .. deep .. "/" .. string.rep("d/", 70) .. "'")
    assert.is_false(core.fs_usage(deep, 100000).complete)
    assert.truthy(core.fs_usage(ws .. "/link", 10).error)    -- a link is never entered
  end)

  it("refuses a turn whose workspace is over workspaceQuotaMb until space is freed (workspace_quota)", function()
    if not service_account() then return end
    local root = tmproot()
    local d = fake.new(fake.reply(true, "done"))
    local rt = runtime.new(options_for(root, { driver = d, workspaceQuotaMb = 1, diskReserveMb = 0 }))
    run(function()
      rt:run_turn("fake:a", GUEST, "hi")
      local ws = d.calls[1].spec.workspaceDir
      write_mib(ws .. "/big", 2)
      local r = rt:run_turn("fake:a", GUEST, "hi")
      failed(r, "workspace_quota", "sandbox workspace is over its quota")
      assert.equal("workspace_quota", errors.entry(r.error).reason)
      assert.matches("an operator must free space in this channel's workspace under " .. root .. "/work", r.fix, 1, true)
      assert.equal(1, #d.calls)                           -- refused before the driver
      assert.truthy(rt:run_turn("fake:b", GUEST, "hi").ok)  -- another channel works
      os.remove(ws .. "/big")
      assert.truthy(rt:run_turn("fake:a", GUEST, "hi").ok)  -- freed: the channel works again
      assert.same({}, core.fs_readdir(root .. "/run"))
      rt:dispose()
    end)
  end)

  it("the watchdog stops a turn whose workspace grows past the quota (workspace_quota)", function()
    if not service_account() then return end
    local root = tmproot()
    local d = fake.new(function(spec, turn, sig)
      if turn.text == "fill" then
        write_mib(spec.workspaceDir .. "/fill", 3)
        fake.wait_abort(sig)
        error(sig.reason, 0)
      end
      return { ok = true, text = "done" }
    end)
    local rt = runtime.new(options_for(root, { driver = d, workspaceQuotaMb = 2, diskReserveMb = 0 }))
    run(function()
      failed(rt:run_turn("fake:hostile", GUEST, "fill"), "workspace_quota", "sandbox workspace is over its quota")
      -- its next turn is refused until an operator frees space; others work
      failed(rt:run_turn("fake:hostile", GUEST, "hi"), "workspace_quota", "sandbox workspace is over its quota")
      assert.truthy(rt:run_turn("fake:other", GUEST, "hi").ok)
      assert.same({}, core.fs_readdir(root .. "/run"))
      rt:dispose()
    end)
  end)

  it("the watchdog looks sooner the less room is left above diskReserveMb (every 100 ms at most, 10 ms at least)", function()
    local disk = require "sandbox.runtime._disk"
    assert.equal(disk.TICK_MS, disk.tick_delay(math.huge))
    assert.equal(disk.TICK_MS, disk.tick_delay(64 * 1024 * MIB))
    assert.equal(disk.MIN_TICK_MS, disk.tick_delay(0))
    assert.equal(disk.MIN_TICK_MS, disk.tick_delay(-MIB))      -- below the reserve
    -- between two looks a turn writing MAX_WRITE_RATE uses at most 1/ROOM_SHARE of the room
    -- (hostile_spec.lua's loop filesystem has ~420 MiB above its 32 MiB reserve)
    for _, room in ipairs { 420 * MIB, 2048 * MIB } do
      local ms = disk.tick_delay(room)
      assert.is_true(ms > disk.MIN_TICK_MS and ms < disk.TICK_MS, tostring(ms))
      assert.is_true(disk.MAX_WRITE_RATE * ms / 1000 <= room / disk.ROOM_SHARE, tostring(ms))
    end
    -- a turn on a filesystem with little room: the first look comes long before TICK_MS
    local root = tmproot()
    local ws = root .. "/work/ws"
    assert(core.fs_mkdir_p(ws))
    local o = { workspaceRoot = root .. "/work", runRoot = root, workspaceQuotaMb = 16,
      diskReserveMb = math.max(1, core.fs_statfs(root).free // MIB - 64) }
    local wd = disk.watchdog(o)
    local looks = 0
    wd.tick = function(self) looks = looks + 1 end
    run(function()
      local turn = { signal = { aborted = false } }
      wd:add(turn, ws, disk.before_turn(o, ws))
      async.sleep(disk.TICK_MS // 2)                      -- a timer due after the first look's
      wd:remove(turn)
    end)
    assert.is_true(looks >= 1)
  end)

  it("with two turns on one filesystem, only the one that grew is stopped", function()
    if not service_account() then return end
    local root = tmproot()
    local release
    local d = fake.new(function(spec, turn, sig)
      if turn.text == "fill" then
        write_mib(spec.workspaceDir .. "/fill", 3)
        fake.wait_abort(sig)
        error(sig.reason, 0)
      end
      async.await(function(resume) release = resume end)
      return { ok = true, text = "bystander" }
    end)
    local rt = runtime.new(options_for(root, { driver = d, workspaceQuotaMb = 2, diskReserveMb = 0 }))
    run(function()
      local by = async.spawn(rt.run_turn, rt, "fake:by", GUEST, "wait")
      spec_fs.wait_for(function() return release ~= nil end, "the bystander")
      failed(rt:run_turn("fake:hostile", GUEST, "fill"), "workspace_quota", "sandbox workspace is over its quota")
      release()
      local bok, reply = async.wait(by)
      assert.is_true(bok, tostring(reply))
      assert.equal("bystander", reply.text)
      rt:dispose()
    end)
  end)

  it("refuses every turn with disk_low while free space is below diskReserveMb", function()
    if not service_account() then return end
    local root = tmproot()
    local d = fake.new(fake.reply(true, "done"))
    local free = core.fs_statfs(root).free
    local rt = runtime.new(options_for(root, { driver = d, diskReserveMb = free // MIB + 1024 }))
    run(function()
      failed(rt:run_turn("fake:a", GUEST, "hi"), "disk_low", "sandbox disk space is below diskReserveMb")
      assert.equal(0, #d.calls)
      rt:dispose()
    end)
  end)
end)

-- What every child script starts with: fake_runtime(root, driver, over).
local CHILD_PRELUDE = [[
local function fake_runtime(root, driver, over)
  local o = { image = "x:y", runRoot = root .. "/run", workspaceRoot = root .. "/work", model = "m",
    modelUrl = "https://models.example/v1", apiKey = function() return "k" end, driver = driver }
  for k, v in pairs(over or {}) do o[k] = v end
  return require("sandbox.runtime").new(o)
end
]]

-- A Lua script run in a child process whose RLIMIT_NOFILE is `nofile`
-- (soft, and hard when `hard` is true); returns its stdout lines, exit status.
local function child(nofile, hard, body, dir)
  dir = dir or tmproot()
  local script = dir .. "/child.lua"
  spec_fs.write(script, 'package.path = "lua/?.lua;lua/?/init.lua;spec/support/?.lua;" .. package.path\n'
    .. 'package.cpath = "' .. (package.cpath:match("(build[^;]*/%?%.so)") or "build/lua/?.so") .. ';" .. package.cpath\n'
    .. CHILD_PRELUDE .. body)
  local out = sh(string.format("sh -c 'ulimit -S -n %d%s; exec lua5.4 %s %s' 2>&1; echo \"exit=$?\"", nofile,
    hard and (" ; ulimit -H -n " .. nofile) or "", script, dir))
  return out
end

describe("descriptors (hardening.md 2)", function()
  it("raises the soft RLIMIT_NOFILE to the hard limit at startup and logs the value", function()
    if not service_account() then return end
    local out = child(200, false, [[
local runtime = require "sandbox.runtime"
local fake = require "fake_driver"
local root = arg[1]
local lines = {}
local function keep(level) return function(msg, fields) lines[#lines + 1] = level .. " " .. msg .. " " .. tostring(fields and fields.nofile) end end
local rt = fake_runtime(root, fake.new(fake.reply(true, "d")), { logger = { info = keep "info", warn = keep "warn", error = keep "error" } })
local soft, hard = require("sandbox.core").fd_raise()
print(lines[1], soft == hard)
require("sandbox.async").run(function() rt:dispose() end)
]])
    local hard = tonumber(sh("sh -c 'ulimit -H -n'"))
    assert.matches("info descriptor limit " .. hard .. "\ttrue\nexit=0", out, 1, true)
  end)

  it("budgets connections: 2 guaranteed per listener, the rest from the pool, over-share closed at once", function()
    if not service_account() then return end
    local dir = tmproot()
    -- the guests' side, another process (as the containers are): 16
    -- connections to a.sock, then 6 to b.sock, held until told to stop
    spec_fs.write(dir .. "/guests.lua", [[
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "build/lua/?.so;" .. package.cpath
local core = require "sandbox.core"
local async = require "sandbox.async"
local dir = arg[1]
local function flag(name) local f = io.open(dir .. "/" .. name) if f then f:close() return true end end
local function touch(name) local f = io.open(dir .. "/" .. name, "w") f:close() end
local held = {}
async.run(function()
  while not flag("listening") do async.sleep(10) end
  for _ = 1, 16 do held[#held + 1] = core.unix_stream(dir .. "/a.sock", function() end) end
  async.sleep(100)
  touch("a.done")
  for _ = 1, 6 do held[#held + 1] = core.unix_stream(dir .. "/b.sock", function() end) end
  async.sleep(100)
  touch("b.done")
  while not flag("stop") do async.sleep(10) end
end)
]])
    -- 70 descriptors: the base (~12), the host reserve (24), the two turns
    -- the listeners belong to (2 x 8) and one turn's headroom (8) leave a
    -- pool of about 10 pooled connections
    local out = child(70, true, [[
local core = require "sandbox.core"
local async = require "sandbox.async"
local dir = arg[1]
local function flag(name) local f = io.open(dir .. "/" .. name) if f then f:close() return true end end
local function touch(name) local f = io.open(dir .. "/" .. name, "w") f:close() end
local function listen(name)
  return assert(core.broker_listen { path = dir .. "/" .. name .. ".sock", routes = { "/model" },
    on_call = function(call) call:reply(200, "{}") end })
end
core.fd_budget()                           -- measured before any connection
assert(core.fd_turn_acquire() and core.fd_turn_acquire(), "the listeners' two turns")
local l1, l2 = listen("a"), listen("b")
os.execute("lua5.4 " .. dir .. "/guests.lua " .. dir .. " &")
touch("listening")
async.run(function()
  while not flag("a.done") do async.sleep(10) end
  local pool = core.fd_budget().pool
  local a = l1:stats().connections
  while not flag("b.done") do async.sleep(10) end
  print("pool", pool, "used", core.fd_budget().pool_used, "a", a, "b", l2:stats().connections)
  -- a third turn takes the headroom; a fourth's charge does not fit beside
  -- the pooled connections until idle ones are reclaimed
  print("first", core.fd_turn_acquire())
  local ok, short = core.fd_turn_acquire()
  print("second", ok, short)
  local closed = core.broker_reclaim(short)
  async.sleep(20)
  print("reclaimed", closed, core.fd_turn_acquire(), l1:stats().connections)
  touch("stop")
  l1:stop()
  l2:stop()
end)
]], dir)
    local pool, used, a, b = out:match("pool\t(%d+)\tused\t(%d+)\ta\t(%d+)\tb\t(%d+)")
    assert.truthy(pool, out)
    pool, used, a, b = tonumber(pool), tonumber(used), tonumber(a), tonumber(b)
    assert.is_true(pool > 0 and pool < 14, out)
    assert.equal(pool, used, out)                         -- every pooled slot taken ...
    assert.equal(2 + pool, a, out)                        -- ... by the first listener; the rest closed at once
    assert.equal(2, b, out)                               -- the second still has its two guaranteed
    assert.matches("first\ttrue", out, 1, true)
    local short = tonumber(out:match("second\tfalse\t(%d+)"))
    assert.truthy(short, out)
    local closed, acquired, left = out:match("reclaimed\t(%d+)\t(%a+)\t(%d+)")
    assert.equal(short, tonumber(closed), out)
    assert.equal("true", acquired, out)
    assert.equal(2 + pool - short, tonumber(left), out)
    assert.matches("exit=0", out, 1, true)
  end)

  -- EMFILE at accept never stops a listener (the reserved-descriptor pattern):
  -- spec/conn_spec.lua runs that case against both request policies (the
  -- sealed and precheck buffered one, the rich streaming one).

  it("a turn the descriptors cannot carry waits, then fails host_descriptors at its deadline; the driver never runs", function()
    if not service_account() then return end
    local out = child(36, true, [[
local runtime = require "sandbox.runtime"
local async = require "sandbox.async"
local fake = require "fake_driver"
local root = arg[1]
local quiet = function() end
local d = fake.new(fake.reply(true, "done"))
local rt = fake_runtime(root, d, { turnTimeoutMs = 1000, logger = { info = quiet, warn = quiet, error = quiet } })
async.run(function()
  local r = rt:run_turn("fake:a", { id = "g", name = "G", principalId = "p" }, "hi")
  print(r.ok, r.reason, r.error, #d.calls)
  rt:dispose()
end)
]])
    assert.matches("false\thost_descriptors\tsandbox host is out of file descriptors\t0\nexit=0", out, 1, true)
  end)
end)

describe("turn directories a cleanup could not remove (hardening.md 2)", function()
  it("are retried by the next turn and by dispose, never left once removable again", function()
    if not service_account() then return end
    local root = tmproot()
    local stuck
    local d = fake.new(function(spec, turn)
      if turn.text == "stick" then
        -- something under the turn directory the walk cannot open (as a
        -- descriptor shortage would): its removal fails for now
        stuck = spec.runDir .. "/stuck"
        os.execute("mkdir -p '" .. stuck .. "/x' && chmod 000 '" .. stuck .. "'")
      end
      return { ok = true, text = "done" }
    end)
    local logger, lines = capture()
    local rt = runtime.new(options_for(root, { driver = d, logger = logger }))
    run(function()
      assert.is_true(rt:run_turn("fake:a", GUEST, "stick").ok)
    end)
    assert.equal(1, #core.fs_readdir(root .. "/run"))      -- kept, and said so
    local kept
    for _, l in ipairs(lines) do
      if l.level == "error" and l.msg:match("could not be removed") then kept = l end
    end
    assert.truthy(kept, "no line for the kept directory")
    os.execute("chmod 700 '" .. stuck .. "'")
    run(function() assert.is_true(rt:run_turn("fake:b", GUEST, "hi").ok) end)
    assert.same({}, core.fs_readdir(root .. "/run"))       -- the next turn removed it
    -- and dispose, when no turn comes
    run(function() assert.is_true(rt:run_turn("fake:a", GUEST, "stick").ok) end)
    assert.equal(1, #core.fs_readdir(root .. "/run"))
    os.execute("chmod 700 '" .. stuck .. "'")
    run(function() rt:dispose() end)
    assert.same({}, core.fs_readdir(root .. "/run"))
  end)
end)

describe("the reply decoder's host memory (hardening.md 7; behaviour 7)", function()
  it("refuses a 2 MiB [{},{},…] stdout before building, with peak RSS within 4x the 2 MiB cap", function()
    if not service_account() then return end
    if package.cpath:match("build%-asan/") then
      -- ASan keeps freed blocks in quarantine and pads every one: a peak
      -- there measures the sanitizer; the normal build's run measures this
      pending("peak RSS is measured against the normal build, not the sanitizer's")
      return
    end
    local root = tmproot()
    -- a fake docker CLI whose `run` prints the amplifying reply (just under 2 MiB)
    local doc = '{"ok":true,"text":"x","pad":[' .. string.rep("{},", 699000) .. '{}]}'
    assert.is_true(#doc < 2097152)
    spec_fs.write(root .. "/reply.json", doc)
    spec_fs.write(root .. "/docker", "#!/bin/sh\ncase \"$1\" in\n  run) cat >/dev/null; cat '" .. root
      .. "/reply.json' ;;\n  *) exit 0 ;;\nesac\n")
    os.execute("chmod 700 '" .. root .. "/docker'")
    doc = nil
    local cli = require "sandbox.drivers.cli"
    local rt = runtime.new(options_for(root, { driver = cli { binary = root .. "/docker" } }))
    local before = collectgarbage("count")
    local grew, r = probe_images.peak_growth(function()
      return run(function() return rt:run_turn("fake:amp", GUEST, "hi") end)
    end)
    failed(r, "invalid_reply", "invalid sandbox reply")
    assert.is_true(grew <= 4 * 2097152, string.format("peak grew by %.1f MiB", grew / MIB))
    assert.is_true(collectgarbage("count") - before < 16 * 1024)
    run(function() rt:dispose() end)
  end)
end)
