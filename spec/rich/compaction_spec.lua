-- rich/compaction_spec.lua: the host's compaction routes (spec/rich-mode.md
-- 15.3-15.5; behaviours 110/111/114 on the host side, 113, 118-121): every
-- fallback with its logged reason, the per-turn limits, the timeouts, a deaf
-- compactor still holding the slot, and the report log lines. Real broker
-- socket (rich.broker), real loop timers.
local async = require "sandbox.async"
local core = require "sandbox.core"
local harness = require "rich_harness"
local json = require "sandbox.json"

local function request(over)
  local r = {
    reason = "manual", tokensBefore = 310000, firstKeptEntryId = "e-kept-1", isSplitTurn = false,
    messagesToSummarize = json.array { { role = "user", content = "hello" } }, turnPrefixMessages = json.array(),
    keptMessages = json.array { { role = "assistant", content = "hi" } }, readFiles = json.array(), modifiedFiles = json.array(),
  }
  for k, v in pairs(over or {}) do r[k] = v end
  return r
end

local function answer(res) return json.decode(res.body) end

describe("rich compaction routes (15.3-15.5)", function()
  local h
  after_each(function() if h then h:stop() h = nil end end)

  local function broker(compact, extra)
    local c = nil
    if compact then
      c = { engine = "my-compaction", compact = compact, timeoutMs = (extra or {}).timeoutMs, maxRequestBytes = (extra or {}).maxRequestBytes }
    end
    h = harness.new { over = { compaction = c, turnTimeoutMs = (extra or {}).turnTimeoutMs or 600000 } }
    return h
  end

  it("B110/B111: a host summary answers with details.engine and logs; each fallback has its exact reason", function()
    local calls = 0
    broker(function(req, ctx)
      calls = calls + 1
      assert.equal("discord:party", ctx.channel)
      if req.customInstructions == "decline" then return nil end
      if req.customInstructions == "throw" then error({ name = "Error", message = "service unreachable" }, 0) end
      if req.customInstructions == "moved" then return { summary = "s", firstKeptEntryId = "e-other", tokensBefore = 1 } end
      return { summary = "They planned a trip.", firstKeptEntryId = req.firstKeptEntryId, tokensBefore = req.tokensBefore,
        estimatedTokensAfter = 12000, details = { decisions = 3 } }
    end, { maxRequestBytes = 1024 })
    async.run(function()
      local release = h:bind()
      local ok = h:post("/compaction/compact", request())
      assert.equal(200, ok.status)
      local v = answer(ok)
      assert.is_true(v.ok)
      assert.same({ decisions = 3, engine = "my-compaction" }, v.compaction.details)
      assert.equal("e-kept-1", v.compaction.firstKeptEntryId)
      local info
      for _, l in ipairs(h.logs) do if l.msg == "host compactor answered" then info = l.fields end end
      assert.equal(310000, info.tokensBefore)
      assert.equal(12000, info.tokensAfter)
      assert.equal("my-compaction", info.engine)
      release()
      local reasons = {}
      for _, ci in ipairs { "decline", "throw", "moved" } do
        local rel = h:bind()
        reasons[#reasons + 1] = answer(h:post("/compaction/compact", request { customInstructions = ci })).fallback
        rel()
      end
      local rel = h:bind()
      reasons[#reasons + 1] = answer(h:post("/compaction/compact", request { previousSummary = string.rep("x", 2000) })).fallback
      reasons[#reasons + 1] = answer(h:post("/compaction/compact", '{"reason":"later"}')).fallback
      rel()
      assert.same({ "the compactor declined", "the compactor failed: Error: service unreachable",
        "the compactor's result is invalid", "the request is over 1024 bytes", "the request is invalid" }, reasons)
      assert.equal(4, calls)
      local warned = h:warns("compaction falls back to Pi's summary")
      assert.equal(5, #warned)
      assert.same({ channel = "discord:party", engine = "my-compaction", fallback = "the compactor declined" }, warned[1])
    end)
  end)

  it("B113: of five requests in one turn three reach the compactor and two fall back", function()
    local calls = 0
    broker(function(req) calls = calls + 1 return { summary = "s", firstKeptEntryId = req.firstKeptEntryId, tokensBefore = 1 } end)
    async.run(function()
      h:bind()
      local got = {}
      for i = 1, 5 do got[i] = answer(h:post("/compaction/compact", request())) end
      assert.equal(3, calls)
      assert.is_true(got[3].ok)
      assert.equal("the turn already asked for 3 compactions", got[4].fallback)
      assert.equal("the turn already asked for 3 compactions", got[5].fallback)
    end)
  end)

  it("B118/B119: 1.5 s left is too little; with 4 s left the compactor gets 2,000 ms and sees its signal abort", function()
    local calls, aborted = 0, false
    broker(function(_, ctx)
      calls = calls + 1
      async.await(function(resume) ctx.signal:on_abort(function() aborted = true resume() end) end)
      return nil
    end, { timeoutMs = 5000 })
    async.run(function()
      local rel = h:bind { deadline = core.now() + 1500 }
      assert.equal("the turn has too little time left for the host compactor", answer(h:post("/compaction/compact", request())).fallback)
      assert.equal(0, calls)
      rel()
      h:bind { deadline = core.now() + 4000 }
      local v = answer(h:post("/compaction/compact", request()))
      assert.equal(1, calls)
      assert.is_true(aborted)
      local ms = tonumber((tostring(v.fallback)):match("^the compactor took over (%d+) ms$"))
      assert.is_true(ms >= 1900 and ms <= 2000, v.fallback)
    end)
  end)

  it("B120: a compactor deaf to its abort still holds the slot: the next request falls back as already running", function()
    local release_deaf
    broker(function()
      async.await(function(resume) release_deaf = resume end)        -- ignores its abort
      return nil
    end, { timeoutMs = 1000 })
    async.run(function()
      h:bind()
      assert.equal("the compactor took over 1000 ms", answer(h:post("/compaction/compact", request())).fallback)
      assert.equal("a compaction is already running", answer(h:post("/compaction/compact", request())).fallback)
      release_deaf()
      async.sleep(10)
      assert.equal("the compactor took over 1000 ms", answer(h:post("/compaction/compact", request())).fallback)
      release_deaf()
    end)
  end)

  it("without a compactor the fallback says so", function()
    broker(nil)
    async.run(function()
      h:bind()
      assert.equal("the host has no compactor", answer(h:post("/compaction/compact", request())).fallback)
    end)
  end)

  it("B110/B114/B121: reports log their lines; the 17th gets 429, an invalid one 400 and still counts; 410 in the startup scope", function()
    broker(function() return nil end)
    async.run(function()
      assert.equal(410, h:post("/compaction/compact", request()).status)
      assert.equal(410, h:post("/compaction/report", { type = "bypass", reason = "x", tokensBefore = 1 }).status)
      assert.equal(404, h:get("/compaction/report").status)
      h:bind()
      assert.equal(200, h:post("/compaction/report", { type = "end", reason = "manual", aborted = false, willRetry = false,
        engine = "extension", tokensBefore = 310000, tokensAfter = 9000, contextAfter = 9500, nextCompactionAt = 300000 }).status)
      assert.equal(200, h:post("/compaction/report", { type = "bypass", reason = "above the hard ceiling", tokensBefore = 510000 }).status)
      assert.equal(200, h:post("/compaction/report", { type = "end", reason = "overflow", aborted = true, willRetry = true, error = "boom" }).status)
      assert.equal(400, h:post("/compaction/report", { type = "end", reason = "sideways", aborted = false, willRetry = false }).status)
      for _ = 5, 16 do assert.equal(200, h:post("/compaction/report", { type = "bypass", reason = "r", tokensBefore = 0 }).status) end
      local r = h:post("/compaction/report", { type = "bypass", reason = "r", tokensBefore = 0 })
      assert.equal(429, r.status)
      assert.equal("Report budget exhausted", r.body)
      local by = {}
      for _, l in ipairs(h.logs) do by[l.msg] = by[l.msg] or l.fields end
      assert.same({ channel = "discord:party", trigger = "self", engine = "extension", tokensBefore = 310000,
        tokensAfter = 9000, contextAfter = 9500, nextCompactionAt = 300000 }, by["conversation compacted"])
      assert.same({ channel = "discord:party", reason = "above the hard ceiling", tokensBefore = 510000, ceiling = 500000 },
        by["compaction skips the extension for Pi's summary"])
      assert.same({ channel = "discord:party", trigger = "overflow", aborted = true, error = "boom" }, by["compaction failed"])
    end)
  end)
  it("each compaction request writes one audit line: answered calls (fallbacks too) info, refusals warn with their reason", function()
    broker(function(req) return { summary = "s", firstKeptEntryId = req.firstKeptEntryId, tokensBefore = 1 } end)
    local function audits()
      local out = {}
      for _, l in ipairs(h.logs) do
        if l.msg == "broker call" or l.msg == "broker refused" then out[#out + 1] = { l.level, l.msg, l.fields.route, l.fields.status, l.fields.reason } end
      end
      return out
    end
    async.run(function()
      h:post("/compaction/report", { type = "bypass", reason = "r", tokensBefore = 1 })
      h:bind { channel = "discord:party", turnId = "t9" }
      assert.equal(404, h:get("/compaction/compact").status)
      assert.equal(200, h:post("/compaction/compact", request()).status)
      assert.equal(200, h:post("/compaction/report", { type = "bypass", reason = "r", tokensBefore = 1 }).status)
      assert.equal(400, h:post("/compaction/report", "[1]").status)
      assert.equal(400, h:post("/compaction/report", { type = "end" }).status)
    end)
    assert.same({
      { "warn", "broker refused", "/compaction/report", 410, "not_bound" },
      { "warn", "broker refused", "/compaction/compact", 404, "method" },
      { "info", "broker call", "/compaction/compact", 200, nil },
      { "info", "broker call", "/compaction/report", 200, nil },
      { "warn", "broker refused", "/compaction/report", 400, "malformed_json" },
      { "warn", "broker refused", "/compaction/report", 400, "payload" },
    }, audits())
    for _, l in ipairs(h.logs) do
      if l.msg == "broker call" then assert.equal("t9", l.fields.turn) assert.is_true(l.fields.bytes_in > 0) end
    end
  end)
end)
