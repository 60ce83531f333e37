-- rich/runtime_spec.lua: sandbox.rich's lifecycle and runTurn (spec/rich-mode.md
-- 6, 7; behaviours 8, 11, 20-31) with the real broker on the channel's real
-- socket, the worker a rich_peer behind an offline fixture driver (5.1).
local async = require "sandbox.async"
local core = require "sandbox.core"
local fixture = require "rich_fixture_driver"
local harness = require "rich_harness"
local json = require "sandbox.json"
local rich = require "sandbox.rich"
local signal = require "sandbox.signal"
local spec_fs = require "spec_fs"

local dirs, drivers = {}, {}
teardown(function() spec_fs.rmdirs(dirs) end)
-- every fixture worker stops with its test, so nothing is left on the loop
after_each(function()
  for _, d in ipairs(drivers) do d.close() end
  drivers = {}
  async.run(function() async.sleep(60) end)     -- the stopped loops see it and end
end)

local AUTHOR = { id = "123", name = "Ann", principalId = "ann" }

local function reply(text, files)
  return function() return { ok = true, text = text, files = files or json.array() } end
end

local function runtime(over, driver_opts)
  local logs = {}
  local d = fixture.new(driver_opts or { turn = reply("done") })
  drivers[#drivers + 1] = d
  local judged = {}
  local o = {
    partyDir = spec_fs.tmpdir("rrt", dirs, spec_fs.short_tmp()) .. "/p", image = "pi-roundtable-sandbox:pi",
    profiles = { main = { model = "claude-sonnet-4-6" }, other = { model = "claude-opus-4" } },
    oauthToken = function() return "tok" end,
    effort = { judge = function(text, ctx) judged[#judged + 1] = { text = text, level = ctx.level } return "medium" end },
    driver = d, logger = harness.logger(logs), startTimeoutMs = 5000,
  }
  for k, v in pairs(over or {}) do o[k] = v end
  local rt = rich(o)
  return rt, d, logs, judged
end

local function turn(over)
  local t = { channel = "discord:party", profile = "main", turnId = "t1", author = AUTHOR, text = "hello", images = {} }
  for k, v in pairs(over or {}) do t[k] = v end
  return t
end

local function find(logs, msg)
  for _, l in ipairs(logs) do if l.msg == msg then return l.fields end end
end

local function run(fn) return async.run(fn) end

describe("rich runtime: turns (7)", function()
  it("B30/B31: the worker's turn carries the author, memory and judged level; reply files come back as bytes", function()
    local seen = {}
    local rt, _, _, judged = runtime({ memory = { visibility = "shared", promptBlock = function(ch, id, name, principal)
      return "facts for " .. ch .. " " .. id .. " " .. name .. " " .. principal
    end } }, { turn = function(t) seen[#seen + 1] = t return { ok = true, text = "Hi Ann",
      files = json.array { { name = "art.png", data = core.base64("\137PNG bytes") } } } end })
    run(function()
      local r = rt:runTurn(turn())
      assert.is_true(r.ok)
      assert.equal("Hi Ann", r.text)
      assert.same({ { name = "art.png", data = "\137PNG bytes" } }, r.files)
      r = rt:runTurn(turn { turnId = "t2", text = "again" })
      assert.is_true(r.ok)
      -- another channel has a level of its own; stop forgets this one's (6)
      assert.is_true(rt:runTurn(turn { channel = "discord:other", turnId = "t3", text = "elsewhere" }).ok)
      rt:stop("discord:party")
      assert.is_true(rt:runTurn(turn { turnId = "t4", text = "fresh" }).ok)
      rt:stopBrokers()
    end)
    local t = json.plain(seen[1])
    assert.same({ id = "123", name = "Ann", principalId = "ann" }, t.author)
    assert.equal("facts for discord:party 123 Ann ann", t.memory)
    assert.equal("shared", t.memoryVisibility)
    assert.equal("medium", t.thinking)
    assert.equal("hello", t.text)
    assert.same({ { text = "hello" }, { text = "again", level = "medium" }, { text = "elsewhere" }, { text = "fresh" } }, judged)
  end)

  it("B22: a worker that answered ok=false keeps its reason, logs timedOut false, and is neither read nor removed", function()
    local rt, d, logs = runtime({}, { turn = function() return { ok = false, error = "prompt failed: nope" } end })
    local r
    run(function() r = rt:runTurn(turn()) rt:stopBrokers() end)
    assert.is_false(r.ok)
    assert.equal("Sandbox turn failed: Worker turn failed: prompt failed: nope", r.error)
    assert.equal("Worker turn failed: prompt failed: nope", r.cause)
    local f = find(logs, "sandbox turn failed")
    assert.same({ channel = "discord:party", turn = "t1", message = "Worker turn failed: prompt failed: nope",
      timedOut = false, cancelled = false }, f)
    assert.equal(0, d.count("logs"))
    assert.equal(0, d.count("remove"))
  end)

  it("B20: aborting a turn gives ok=false and removes exactly roundtable-sandbox-<segment>, once", function()
    local gate = signal.new()
    local rt, d = runtime({}, { turn = function()
      async.await(function(resume) gate:on_abort(resume) end)
      return { ok = true, text = "late", files = json.array() }
    end })
    local caller = signal.new()
    local r
    run(function()
      local t = async.spawn(function() r = rt:runTurn(turn { signal = caller }) end)
      harness.eventually(function() return rt:broker("discord:party") and rt:broker("discord:party").pending and rt:broker("discord:party").pending.delivered end)
      caller:abort("user")
      async.wait(t)
      gate:abort("go")
      rt:stopBrokers()
    end)
    assert.is_false(r.ok)
    assert.equal("Sandbox turn failed: Turn cancelled", r.error)
    local removed = {}
    for _, c in ipairs(d.calls) do if c.op == "remove" then removed[#removed + 1] = c.arg end end
    assert.same({ "roundtable-sandbox-discord_party" }, removed)
  end)

  it("B21: a timed-out turn is exactly 'Sandbox turn timed out', reads logs(200) before remove, logs the flags and lines", function()
    local rt, d, logs = runtime({ turnTimeoutMs = 1000 }, { turn = function()
      async.sleep(3000)
      return { ok = true, text = "late", files = json.array() }
    end, logs = "worker line one\nworker line two\n\n" })
    local r
    run(function() r = rt:runTurn(turn()) rt:stopBrokers() end)
    assert.same({ ok = false, error = "Sandbox turn timed out", cause = "Turn cancelled" }, r)
    local ops = {}
    for _, c in ipairs(d.calls) do if c.op == "logs" or c.op == "remove" then ops[#ops + 1] = c.op end end
    assert.same({ "logs", "remove" }, ops)
    for _, c in ipairs(d.calls) do if c.op == "logs" then assert.same({ "roundtable-sandbox-discord_party", 200 }, c.arg) end end
    local f = find(logs, "sandbox turn failed")
    assert.is_true(f.timedOut)
    assert.is_false(f.cancelled)
    assert.equal("worker line one\nworker line two", find(logs, "sandbox worker log before removal").lines)
  end)

  it("B23: a second concurrent turn on a channel gets Channel is busy", function()
    local gate = signal.new()
    local rt = runtime({}, { turn = function()
      async.await(function(resume) gate:on_abort(resume) end)
      return { ok = true, text = "ok", files = json.array() }
    end })
    run(function()
      local first = async.spawn(function() return rt:runTurn(turn()) end)
      async.sleep(0)
      assert.same({ ok = false, error = "Channel is busy" }, rt:runTurn(turn { turnId = "t2" }))
      gate:abort("go")
      local _, r = async.wait(first)
      assert.is_true(r.ok)
      rt:stopBrokers()
    end)
  end)

  it("B24: a worker that never posts ready fails start with Worker did not become ready", function()
    local rt = runtime({ startTimeoutMs = 1000 }, { ready = false })
    run(function()
      local ok, err = pcall(rt.start, rt, "discord:party", "main")
      assert.is_false(ok)
      assert.equal("Worker did not become ready", err)
      rt:stopBrokers()
    end)
  end)

  it("B25-B27: the input, memory, judge and profile checks", function()
    local rt = runtime({ memory = { promptBlock = function() return string.rep("m", 100001) end } })
    run(function()
      assert.equal("Sandbox turn failed: Memory context too large", rt:runTurn(turn()).error)
      for _, over in ipairs {
        { text = string.rep("é", 100001) }, { author = { id = "1", name = string.rep("n", 257) } },
        { author = { id = "1", name = "A", principalId = "" } }, { turnId = "../t" }, { turnId = "" },
      } do
        local r = rt:runTurn(turn(over))
        assert.equal("Sandbox turn failed: Invalid turn input", r.error)
        assert.equal("Invalid turn input", r.cause)
      end
      assert.equal("Sandbox turn failed: Too many images", rt:runTurn(turn { images = { 1, 2, 3, 4, 5, 6, 7, 8, 9 } }).error)
      assert.equal("Sandbox turn failed: Invalid or oversized image",
        rt:runTurn(turn { images = { { mimeType = "text/plain", data = "aGk=" } } }).error)
      assert.equal("Sandbox turn failed: Invalid or oversized image",
        rt:runTurn(turn { images = { { mimeType = "image/png", data = "a$b=" } } }).error)
      assert.equal("Sandbox turn failed: Unknown profile", rt:runTurn(turn { profile = "nope" }).error)
      rt:stopBrokers()
    end)
    local rt2 = runtime({ effort = { judge = function() return "extreme" end } })
    run(function()
      assert.equal("Sandbox turn failed: Invalid effort level", rt2:runTurn(turn()).error)
      rt2:stopBrokers()
    end)
  end)
end)

describe("rich runtime: lifecycle (6)", function()
  it("B8/B11: sessionsDir is partyDir/<segment>/workspace/sessions; JSONL files are untouched; a planted attachments link is replaced", function()
    local rt, d = runtime()
    local p = rt.o.partyDir
    run(function()
      assert.equal(p .. "/discord_party/workspace/sessions", rt:sessionsDir("discord:party"))
      assert.equal(p .. "/discord_party/workspace/attachments", rt:attachmentDir("discord:party"))
      assert.is_true(rt:runTurn(turn()).ok)
      local sessions = rt:sessionsDir("discord:party")
      spec_fs.write(sessions .. "/s1.jsonl", '{"type":"session"}\n')
      local target = spec_fs.tmpdir("rrt-t", dirs, spec_fs.short_tmp())
      local att = rt:attachmentDir("discord:party")
      core.fs_rmtree(att)
      os.execute("ln -s " .. spec_fs.q(target) .. " " .. spec_fs.q(att))
      rt:stop("discord:party")
      assert.is_true(rt:runTurn(turn { turnId = "t2" }).ok)
      assert.equal("dir", core.fs_lstat(att).type)
      assert.same({}, core.fs_readdir(target))
      assert.equal('{"type":"session"}\n', spec_fs.read(sessions .. "/s1.jsonl"))
      assert.same({ state = "running", image = "pi-roundtable-sandbox:pi", profile = "main" }, rt:status("discord:party"))
      rt:stopBrokers()
    end)
    assert.equal(1, d.count("remove"))
  end)

  it("B9: discord:a:b then discord:a_b is an alias refusal, and no workspace is renamed", function()
    local rt = runtime()
    run(function()
      assert.is_true(rt:runTurn(turn { channel = "discord:a:b" }).ok)
      local r = rt:runTurn(turn { channel = "discord:a_b" })
      assert.equal("Sandbox turn failed: Channel workspace alias refused", r.error)
      assert.has_error(function() rt:sessionsDir("discord:a_b") end, "Channel workspace alias refused")
      assert.has_error(function() rt:status("discord:a_b") end, "Channel workspace alias refused")
      assert.equal(rt.o.partyDir .. "/discord_a_b/workspace/sessions", rt:sessionsDir("discord:a:b"))
      rt:stopBrokers()
    end)
  end)

  it("B28/B29: startFresh archives plain top-level JSONL files only, and replaces planted links without following them", function()
    local rt, _, logs = runtime()
    local outside = spec_fs.tmpdir("rrt-o", dirs, spec_fs.short_tmp())
    spec_fs.write(outside .. "/keep.jsonl", "outside\n")
    run(function()
      assert.is_true(rt:runTurn(turn()).ok)
      local s = rt:sessionsDir("discord:party")
      spec_fs.write(s .. "/a.jsonl", "a\n")
      spec_fs.write(s .. "/b.jsonl", "b\n")
      spec_fs.write(s .. "/notes.txt", "n\n")
      os.execute("ln -s " .. spec_fs.q(outside .. "/keep.jsonl") .. " " .. spec_fs.q(s .. "/link.jsonl"))
      os.execute("ln -s " .. spec_fs.q(outside) .. " " .. spec_fs.q(s .. "/archive"))
      rt:startFresh("discord:party")
      assert.equal("dir", core.fs_lstat(s .. "/archive").type)
      local stamps = core.fs_readdir(s .. "/archive")
      assert.equal(1, #stamps)
      assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d%-%d%d%-%d%dZ$", stamps[1])
      local moved = core.fs_readdir(s .. "/archive/" .. stamps[1])
      table.sort(moved)
      assert.same({ "a.jsonl", "b.jsonl" }, moved)
      assert.equal("link", core.fs_lstat(s .. "/link.jsonl").type)
      assert.equal("file", core.fs_lstat(s .. "/notes.txt").type)
      assert.same({ "keep.jsonl" }, core.fs_readdir(outside))
      assert.equal(2, find(logs, "Sandbox conversation archived").archived)
      -- startFresh owns attachments too: a planted link is replaced, its target untouched
      local att = rt:attachmentDir("discord:party")
      core.fs_rmtree(att)
      os.execute("ln -s " .. spec_fs.q(outside) .. " " .. spec_fs.q(att))
      rt:startFresh("discord:party")
      assert.equal("dir", core.fs_lstat(att).type)
      assert.same({ "keep.jsonl" }, core.fs_readdir(outside))
      -- a symlinked sessions is replaced by an empty real directory, its target untouched
      core.fs_rmtree(s)
      os.execute("ln -s " .. spec_fs.q(outside) .. " " .. spec_fs.q(s))
      rt:startFresh("discord:party")
      assert.equal("dir", core.fs_lstat(s).type)
      assert.same({}, core.fs_readdir(s))
      assert.same({ "keep.jsonl" }, core.fs_readdir(outside))
      rt:stopBrokers()
    end)
  end)

  it("start runs once per channel: a caller finding a start pending waits for it", function()
    local rt, d = runtime()
    run(function()
      local a = async.spawn(function() rt:start("discord:party", "main") end)
      local b = async.spawn(function() rt:start("discord:party", "main") end)
      assert.is_true((async.wait(a)))
      assert.is_true((async.wait(b)))
      assert.equal(1, d.count("ensureRunning"))
      rt:start("discord:party", "other")                  -- another profile: a new broker and container
      assert.equal("other", d.running["roundtable-sandbox-discord_party"].profile)
      rt:stopBrokers()
    end)
  end)
end)
