-- rich/hostile_bodies_spec.lua: hostile bodies against real rich brokers over
-- real Unix sockets (issue 21 item 2). The brokers run in a host process of
-- their own (spec/support/body_host.lua) whose peak memory (VmHWM, reset once
-- it listens) is what is bounded; the attacker (spec/support/body_send.lua,
-- a process per request) sends every body at once from several channels
-- while a bystander
-- channel runs turn after turn (each with a model call) in the same host.
-- Each body is at its route's limit and made of the worst shapes for Lua
-- tables: empty objects and arrays, deep nesting, long member names, many
-- small strings, and the worst mix the decode budget still lets through.
-- Without bounded, shape-first decoding the host takes about 64x each body
-- (bench/results.md): several GB here.
local A = require "body_attack"
local async = require "sandbox.async"
local harness = require "rich_harness"
local json = require "sandbox.json"
local spec_fs = require "spec_fs"

local MiB = A.MiB
-- The rule: at most 4x the bodies in flight, plus what the host's own work
-- (the bystander's turns, the model answers) may take.
local FACTOR, SLACK = 4, 64 * MiB

local function run(attacks, kinds)
  local dirs = {}
  local dir = spec_fs.tmpdir("hb", dirs)
  local total = 0
  for n, a in ipairs(attacks) do
    local body = A.body(a.route, a.fill, A.limit_of(a.route), "t" .. a.i)
    assert(#body <= A.limit_of(a.route))
    a.file = ("%s/b%d.json"):format(dir, n)
    A.write(a.file, body)
    total = total + #body
  end
  local ok, report, answers = pcall(A.run, { dir = dir, kinds = kinds, attacks = attacks, settle_ms = 300 })
  spec_fs.rmdirs(dirs)
  assert(ok, report)
  return report, answers, total
end

describe("rich broker: hostile bodies at their limits from several channels (issue 21) #slow", function()
  it("refuses each hostile call alone, serves the bystander throughout, and stays within 4x the bodies", function()
    local kinds = { "result", "result", "model", "model", "compact", "model", "bystander" }
    local attacks = {
      { i = 1, route = "result_unknown", fill = "objects" },   -- an unknown member full of {}
      { i = 2, route = "result_known", fill = "strings" },     -- a known member: many small strings
      { i = 3, route = "model_metadata", fill = "objects" },   -- metadata full of {}: dropped unread
      { i = 4, route = "model_messages", fill = "deep" },      -- messages of 60-deep arrays
      { i = 5, route = "compact_kept", fill = "names" },       -- long member names
      { i = 6, route = "model_messages", fill = "mixed" },     -- the worst mix the budget accepts
    }
    local report, answers, total = run(attacks, kinds)
    assert.equal(400, answers[1].status)
    assert.equal("Invalid result", answers[1].body)
    assert.equal(400, answers[2].status)
    assert.equal("Invalid result", answers[2].body)
    -- 11.1: metadata is dropped; the rebuilt call is served
    assert.equal(200, answers[3].status)
    assert.equal(400, answers[4].status)
    assert.equal("Invalid input", answers[4].body)
    assert.equal(200, answers[5].status)
    assert.equal('{"ok":false,"fallback":"the request is invalid"}', answers[5].body)
    assert.equal(400, answers[6].status)
    assert.truthy(answers[6].body:find("Invalid message", 1, true))
    -- the result channels' turns are still pending (refused packets resolve nothing)
    assert.equal("pending", report.results[1])
    assert.equal("pending", report.results[2])
    assert.is_true(report.bystander.ok >= 1, "the bystander was not served")
    assert.equal(0, report.bystander.failed)
    local peak = (report.hwm_kb - report.rss0_kb) * 1024
    assert.is_true(peak <= FACTOR * total + SLACK,
      ("host peak %.0f MiB for %.0f MiB of bodies (%.2fx)"):format(peak / MiB, total / MiB, peak / total))
  end)

  it("refuses the same shapes under the budget on every route kind at once, 8 MiB each, several per channel kind", function()
    local kinds = { "result", "model", "compact", "model", "compact", "bystander" }
    local attacks = {
      { i = 1, route = "result_known", fill = "objects" },
      { i = 2, route = "model_messages", fill = "arrays" },
      { i = 3, route = "compact_unknown", fill = "objects" },
      { i = 4, route = "model_messages", fill = "members" },
      { i = 5, route = "compact_kept", fill = "objects" },
    }
    for _, a in ipairs(attacks) do a.limit = 8 * MiB end
    local saved = A.limit_of
    A.limit_of = function() return 8 * MiB end
    local ok, report, answers, total = pcall(run, attacks, kinds)
    A.limit_of = saved
    assert(ok, report)
    assert.equal(400, answers[1].status)
    assert.equal(400, answers[2].status)
    assert.equal('{"ok":false,"fallback":"the request is invalid"}', answers[3].body)
    assert.equal(400, answers[4].status)
    assert.equal('{"ok":false,"fallback":"the request is invalid"}', answers[5].body)
    assert.equal(0, report.bystander.failed)
    assert.is_true(report.bystander.ok >= 1)
    local peak = (report.hwm_kb - report.rss0_kb) * 1024
    assert.is_true(peak <= FACTOR * total + SLACK,
      ("host peak %.0f MiB for %.0f MiB of bodies (%.2fx)"):format(peak / MiB, total / MiB, peak / total))
  end)
end)

describe("sealed and precheck listeners: hostile bodies at their limits from several listeners (issue 21)", function()
  -- core/listener.c decodes a buffered body only once core/json_shape.c's
  -- scan (building nothing) found its cost within 4x the body, at least 16x
  -- the listener's body limit (4 MiB sealed, 1 MiB precheck; core/bounds.h):
  -- a body of nested empty containers at the limit (~80x) is refused 502
  -- with the audit reason body_too_large; what passes takes at most 4 MiB.
  it("refuses what would cost over the budget, serves the bystander, and stays within the budget per call", function()
    local kinds = { "sealed", "sealed", "precheck", "precheck", "bystander" }
    local attacks = {
      { i = 1, route = "sealed_junk", fill = "objects" }, { i = 2, route = "sealed_junk", fill = "deep" },
      { i = 3, route = "precheck_junk", fill = "objects" }, { i = 4, route = "precheck_junk", fill = "arrays" },
    }
    local report, answers = run(attacks, kinds)
    assert.equal(502, answers[1].status)          -- 256 KiB of {}: refused before anything was built
    assert.equal(502, answers[3].status)          -- 64 KiB of {}: over precheck's 1 MiB floor too
    assert.equal(502, answers[4].status)          -- 64 KiB of []: the same
    for n = 1, 4 do assert.is_true(answers[n].status == 200 or answers[n].status == 502, tostring(answers[n].status)) end
    assert.equal(0, report.bystander.failed)
    local peak = (report.hwm_kb - report.rss0_kb) * 1024
    assert.is_true(peak <= #attacks * 4 * MiB + SLACK, ("host peak %.1f MiB"):format(peak / MiB))
  end)
end)

-- The same rules, route by route, in this process (fast; not #slow).
describe("rich broker: bodies are judged by their shape before anything is built (issue 21)", function()
  local TURN = { turnId = "t1", author = { id = "1", name = "A", principalId = "a" }, text = "hi", memory = "",
    memoryVisibility = "private", images = {}, thinking = "high" }
  local GOOD = '{"turnId":"t1","result":{"ok":true,"text":"done","files":[]}}'
  local h
  after_each(function() if h then h:stop() h = nil end end)

  local function audit_reasons()
    local out = {}
    for _, l in ipairs(h.logs) do
      if l.msg == "broker refused" or l.msg == "broker call" then out[#out + 1] = l.fields.reason or "-" end
    end
    return out
  end

  it("a result packet with an unknown member anywhere gets 400 Invalid result and resolves nothing; the good packet then does", function()
    h = harness.new {}
    async.run(function()
      local res
      local exec = async.spawn(function() res = h.b:execute(TURN) end)
      assert.equal(200, h:get("/worker/next").status)
      for _, bad in ipairs {
        '{"turnId":"t1","result":{"ok":true,"text":"done","files":[]},"junk":[{},{}]}',
        '{"turnId":"t1","result":{"ok":true,"text":"done","files":[],"usage":{}}}',
        '{"turnId":"t1","result":{"ok":true,"text":"done","files":[{"name":"a.txt","data":"aGk=","mode":"755"}]}}',
        '{"junk":' .. ("["):rep(64) .. ("]"):rep(64) .. ',"turnId":"t1","result":{"ok":true,"text":"done","files":[]}}',
      } do
        local r = h:post("/worker/result", bad)
        assert.equal(400, r.status, bad)
        assert.equal("Invalid result", r.body)
      end
      local r = h:post("/worker/result", GOOD)
      assert.equal(200, r.status)
      async.wait(exec)
      assert.equal("done", res.text)
    end)
  end)

  it("a ready handshake with an unknown member gets 400 Invalid ready handshake and the broker stays unready", function()
    h = harness.new {}
    async.run(function()
      local r = h:post("/worker/ready", '{"capabilities":{"privateTo":true},"privateHistory":false,"extra":[{}]}')
      assert.equal(400, r.status)
      assert.equal("Invalid ready handshake", r.body)
      r = h:post("/worker/ready", '{"capabilities":{"privateTo":true,"sandbox":true}}')
      assert.equal(400, r.status)
      assert.is_false(h.b.ready)
      r = h:post("/worker/ready", '{"capabilities":{"privateTo":true,"readerRecords":true},"privateHistory":false}')
      assert.equal(200, r.status)
      assert.is_true(h.b.ready)
    end)
  end)

  it("a model body's unknown members are dropped unread; one whose decode would pass the budget gets 400 Invalid input (body_too_large)", function()
    local up = require("anthropic_upstream").start()
    h = harness.new { up = up }
    local ok, err = pcall(async.run, function()
      up:reset()
      up:push { require("anthropic_upstream").sse_text("hi") }
      h:bind()
      local junk = "[" .. ("{},"):rep(100000) .. "{}]"
      local r = h:post("/anthropic/v1/messages", '{"metadata":' .. junk .. ',"messages":[{"role":"user","content":"hi"}],'
        .. '"service_tier":{"x":' .. junk .. '},"max_tokens":5}')
      assert.equal(200, r.status)
      local sent = json.decode(h.fetched[1].body)
      assert.is_nil(sent.metadata)
      assert.is_nil(sent.service_tier)
      assert.equal("hi", sent.messages[1].content)
      -- nested too: a message's and a block's unknown members are never
      -- decoded, nor counted (alone they would pass the budget many times)
      up:push { require("anthropic_upstream").sse_text("hi") }
      local big = "[" .. ("{},"):rep(4 * 1024 * 1024) .. "{}]"
      r = h:post("/anthropic/v1/messages", '{"messages":[{"role":"user","junk":' .. big .. ',"content":[{"type":"text",'
        .. '"citations":' .. big .. ',"text":"hi"}]}]}')
      assert.equal(200, r.status)
      sent = json.decode(h.fetched[2].body)
      assert.equal('[{"role":"user","content":[{"type":"text","text":"hi"}]}]', json.encode(sent.messages))
      local body = '{"messages":[' .. ("{},"):rep(12 * 1024 * 1024 // 3) .. '{}]}'
      r = h:post("/anthropic/v1/messages", body)
      assert.equal(400, r.status)
      assert.equal("Invalid input", r.body)
      assert.equal(2, #h.fetched)
      assert.equal("body_too_large", audit_reasons()[3])
    end)
    up:stop()
    assert(ok, err)
  end)

  it("a tool or MCP body's other members are dropped unread", function()
    local seen
    h = harness.new { over = { tools = { names = { "lookup" }, call = function(_, input) seen = input return { ok = true, text = "ok" } end } } }
    async.run(function()
      h:bind()
      local r = h:post("/tools/lookup", '{"channel":' .. "[" .. ("{},"):rep(50000) .. '{}],"input":{"q":"x"}}')
      assert.equal(200, r.status)
      assert.equal("x", seen.q)
    end)
  end)

  it("a compaction request with an unknown member falls back as invalid before the compactor runs; a report with one gets 400", function()
    local calls = 0
    h = harness.new { over = { compaction = { engine = "my-compaction", compact = function(req)
      calls = calls + 1
      return { summary = "s", firstKeptEntryId = req.firstKeptEntryId, tokensBefore = 1 }
    end }, turnTimeoutMs = 600000 } }
    async.run(function()
      h:bind()
      local base = '{"reason":"manual","tokensBefore":1,"firstKeptEntryId":"e1","isSplitTurn":false,'
        .. '"messagesToSummarize":[],"turnPrefixMessages":[],"keptMessages":[{"role":"user","content":"hi"}],'
        .. '"readFiles":[],"modifiedFiles":[]'
      local r = h:post("/compaction/compact", base .. ',"junk":[{}]}')
      assert.equal('{"ok":false,"fallback":"the request is invalid"}', r.body)
      assert.equal(0, calls)
      r = h:post("/compaction/compact", base .. "}")
      assert.equal(200, r.status)
      assert.equal(1, calls)
      r = h:post("/compaction/report", '{"type":"bypass","reason":"r","tokensBefore":1,"junk":{}}')
      assert.equal(400, r.status)
      assert.equal("Invalid report", r.body)
      r = h:post("/compaction/report", '{"type":"bypass","reason":"r","tokensBefore":1}')
      assert.equal(200, r.status)
    end)
  end)
end)
