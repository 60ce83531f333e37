-- delegator_spec.lua: the scoped delegator (lua/sandbox/delegator/init.lua;
-- spec fetch-and-delegation.md section 3; "Behaviours the specs must cover"
-- 34-43, item numbers in the `it` names as F<n>). Jobs run on the real loop
-- through async.run; the specs wait for state (a delivery, a settled job),
-- never for an amount of time.
local async = require "sandbox.async"
local delegator = require "sandbox.delegator"

local TARGET = "research"

local function new_logger()
  local log = { entries = {} }
  log.error = function(message, fields) log.entries[#log.entries + 1] = { message = message, fields = fields } end
  return log
end

-- A delegator whose deliveries land in `d.delivered`; opts override.
local function make(opts)
  local delivered = {}
  local o = {
    target = TARGET,
    run = function(task) return "report for " .. task end,
    deliver = function(job, outcome) delivered[#delivered + 1] = { job = job, outcome = outcome } end,
    logger = new_logger(),
  }
  for k, v in pairs(opts or {}) do o[k] = v end
  local d = delegator.new(o)
  return d, delivered, o
end

local function request(over)
  local r = {
    channel = "fake:general",
    target = TARGET,
    author = { id = "u1", name = "Ada", principalId = "p-ada", tier = "member" },
    title = "Find sources",
    task = "Find three sources about tides.",
  }
  for k, v in pairs(over or {}) do r[k] = v end
  return r
end

local function author(over)
  local a = { id = "u1", name = "Ada", principalId = "p-ada", tier = "member" }
  for k, v in pairs(over or {}) do a[k] = v end
  return a
end

-- The refusal start() raises for req (asserts it is a DelegationError).
local function refusal(d, req)
  local ok, err = pcall(d.start, d, req)
  assert.is_false(ok, "start should refuse")
  assert.equal("table", type(err))
  assert.equal("DelegationError", err.name)
  assert.is_true(delegator.is_delegation_error(err))
  assert.equal(err.message, tostring(err))
  return err.message
end

local function ctor_error(opts)
  local base = { target = TARGET, run = function() return "" end, deliver = function() end, logger = new_logger() }
  for k, v in pairs(opts) do base[k] = v end
  local ok, err = pcall(delegator.new, base)
  assert.is_false(ok, "new should fail")
  return err
end

-- Inside a task: yields until pred() holds, checking on every loop turn.
local function wait_for(pred)
  while not pred() do async.sleep(1) end
end

local function utf8_chars(n, ch)
  return string.rep(ch or "é", n)
end

describe("scoped delegator options", function()
  it("takes the defaults of spec 3.1", function()
    local d = make()
    assert.equal(2, d.max_running)
    assert.equal(600000, d.timeout_ms)
    assert.equal(200, d.max_title_chars)
    assert.equal(80000, d.max_report_chars)
    assert.equal(600, d.diagnostic_chars)
    assert.equal(TARGET, d.target)
  end)

  it("refuses a missing or empty target, and maxRunning / timeoutMs out of range, with the budget message", function()
    local no_target = { run = function() end, deliver = function() end, logger = new_logger() }
    local ok, err = pcall(delegator.new, no_target)
    assert.is_false(ok)
    assert.equal("Invalid delegation target/budget", err)
    ok, err = pcall(delegator.new, "research")
    assert.equal("Invalid delegation target/budget", err)
    for _, bad in ipairs {
      { target = "" }, { target = 7 },
      { maxRunning = 0 }, { maxRunning = 11 }, { maxRunning = 1.5 }, { maxRunning = 0 / 0 },
      { maxRunning = math.huge }, { maxRunning = "2" },
      { timeoutMs = 999 }, { timeoutMs = 1200001 }, { timeoutMs = 1000.5 }, { timeoutMs = math.huge },
      { timeoutMs = 0 / 0 }, { timeoutMs = -1 },
    } do
      assert.equal("Invalid delegation target/budget", ctor_error(bad))
    end
  end)

  it("accepts the edges of each range, integral floats included", function()
    assert.equal(1, make({ maxRunning = 1 }).max_running)
    assert.equal(10, make({ maxRunning = 10.0 }).max_running)
    assert.equal(1000, make({ timeoutMs = 1000 }).timeout_ms)
    assert.equal(1200000, make({ timeoutMs = 1200000 }).timeout_ms)
  end)

  it("F41: maxTitleChars = 1000 or math.huge accepts a 500-character title; 0, 1.5 and NaN are refused", function()
    for _, limit in ipairs { 1000, math.huge } do
      local d, delivered = make { maxTitleChars = limit }
      async.run(function()
        local job = d:start(request { title = string.rep("t", 500) })
        assert.equal(500, #job.title)
        d:idle()
      end)
      assert.equal(1, #delivered)
    end
    for _, bad in ipairs { 0, 1.5, 0 / 0, -1, -math.huge, "200" } do
      assert.equal("Invalid delegation title limit", ctor_error { maxTitleChars = bad })
    end
  end)

  it("F42: maxReportChars = 0 and diagnosticChars = 0 are refused with their own messages", function()
    for _, bad in ipairs { 0, 2.5, 0 / 0, -3, true } do
      assert.equal("Invalid delegation maxReportChars", ctor_error { maxReportChars = bad })
      assert.equal("Invalid delegation diagnosticChars", ctor_error { diagnosticChars = bad })
    end
  end)

  it("refuses missing or wrongly typed run, deliver or logger with the callbacks message", function()
    local bad_values = {
      run = { "run", {}, 1 },
      deliver = { "deliver", {}, true },
      logger = { "log", {}, { error = "x" }, function() end },
    }
    for key, values in pairs(bad_values) do
      local missing = { target = TARGET, run = function() end, deliver = function() end, logger = new_logger() }
      missing[key] = nil
      local ok, err = pcall(delegator.new, missing)
      assert.is_false(ok)
      assert.equal("Invalid delegation callbacks", err)
      for _, v in ipairs(values) do
        assert.equal("Invalid delegation callbacks", ctor_error { [key] = v })
      end
    end
  end)

  it("checks options in the order of the table: the budget before the title limit before the callbacks", function()
    local ok, err = pcall(delegator.new, { target = "", maxTitleChars = 0 })
    assert.is_false(ok)
    assert.equal("Invalid delegation target/budget", err)
    ok, err = pcall(delegator.new, { target = TARGET, maxTitleChars = 0, maxReportChars = 0 })
    assert.equal("Invalid delegation title limit", err)
    ok, err = pcall(delegator.new, { target = TARGET, maxReportChars = 0, diagnosticChars = 0 })
    assert.equal("Invalid delegation maxReportChars", err)
    ok, err = pcall(delegator.new, { target = TARGET, diagnosticChars = 0 })
    assert.equal("Invalid delegation diagnosticChars", err)
    ok, err = pcall(delegator.new, { target = TARGET })
    assert.equal("Invalid delegation callbacks", err)
  end)
end)

describe("scoped delegator start(): scope", function()
  it("F34: a wrong target, an origin field, tier owner, tier admin and an empty principalId are refused", function()
    local d = make()
    for _, req in ipairs {
      request { target = "other" },
      request { origin = { channel = "fake:elsewhere" } },
      request { author = author { tier = "owner" } },
      request { author = author { tier = "admin" } },
      request { author = author { principalId = "" } },
    } do
      assert.equal("Delegation scope refused", refusal(d, req))
    end
    assert.same({}, d:running_channels())
  end)

  it("refuses any extra field, a bad channel, and an author without id, name, principalId or member tier", function()
    local d = make()
    local no_pid = author(); no_pid.principalId = nil
    local no_tier = author(); no_tier.tier = nil
    local no_name = author(); no_name.name = nil
    for _, req in ipairs {
      request { thread = "t1" }, request { id = 4 }, request { startedAt = 1 }, request { [1] = "x" },
      request { channel = "" }, request { channel = 5 }, request { author = "Ada" },
      request { author = author { id = "" } }, request { author = author { id = 1 } },
      no_name and request { author = no_name }, request { author = author { name = 3 } },
      request { author = no_pid }, request { author = author { principalId = 9 } },
      request { author = no_tier }, request { author = author { tier = "Member" } },
      "not a table", nil,
    } do
      assert.equal("Delegation scope refused", refusal(d, req))
    end
    local no_channel = request(); no_channel.channel = nil
    local no_target = request(); no_target.target = nil
    assert.equal("Delegation scope refused", refusal(d, no_channel))
    assert.equal("Delegation scope refused", refusal(d, no_target))
  end)

  it("accepts an empty author name (it must only be a string)", function()
    local d, delivered = make()
    async.run(function()
      d:start(request { author = author { name = "" } })
      d:idle()
    end)
    assert.equal(1, #delivered)
    assert.equal("", delivered[1].job.author.name)
  end)

  it("checks scope first: an origin field with a missing task still gets the scope refusal", function()
    local d = make()
    assert.equal("Delegation scope refused", refusal(d, request { origin = "x", task = false }))
  end)
end)

describe("scoped delegator start(): title and task", function()
  it("F36: a 4,001-character task, a blank title and a 201-character title get their exact refusals", function()
    local d = make()
    assert.equal("the task is 4001 characters; keep it within 4000", refusal(d, request { task = string.rep("x", 4001) }))
    assert.equal("title and task are required", refusal(d, request { title = " \t\n\u{3000}\u{FEFF}" }))
    assert.equal("the title is 201 characters; keep it within 200", refusal(d, request { title = string.rep("y", 201) }))
  end)

  it("F43: counts code points (200 multi-byte characters pass) and refuses invalid UTF-8", function()
    local d, delivered = make()
    async.run(function()
      local job = d:start(request { title = utf8_chars(200), task = utf8_chars(4000, "日") })
      assert.equal(utf8_chars(200), job.title)
      d:idle()
    end)
    assert.equal(1, #delivered)
    assert.equal("the title is 201 characters; keep it within 200", refusal(d, request { title = utf8_chars(201) }))
    assert.equal("title and task must be valid UTF-8", refusal(d, request { title = "ab\255" }))
    assert.equal("title and task must be valid UTF-8", refusal(d, request { task = "\237\160\128" })) -- a surrogate
    assert.equal("title and task must be valid UTF-8", refusal(d, request { task = "\192\175" }))    -- overlong
  end)

  it("refuses a missing, non-string or blank title or task as required", function()
    local d = make()
    local no_title = request(); no_title.title = nil
    local no_task = request(); no_task.task = nil
    for _, req in ipairs { no_title, no_task, request { title = 5 }, request { task = {} }, request { task = "\u{2003}\u{00A0} " } } do
      assert.equal("title and task are required", refusal(d, req))
    end
  end)

  it("checks UTF-8 before required, required before lengths, and the title before the task", function()
    local d = make()
    assert.equal("title and task must be valid UTF-8", refusal(d, request { title = false, task = "\255" }))
    assert.equal("title and task are required", refusal(d, request { title = string.rep("y", 300), task = " " }))
    assert.equal("the title is 300 characters; keep it within 200",
      refusal(d, request { title = string.rep("y", 300), task = string.rep("x", 5000) }))
  end)

  it("measures the untrimmed title but the trimmed task", function()
    local d, delivered = make { maxTitleChars = 5 }
    assert.equal("the title is 7 characters; keep it within 5", refusal(d, request { title = " abcde " }))
    async.run(function()
      local job = d:start(request { title = "abcde", task = "  " .. string.rep("x", 4000) .. "\n\t" })
      assert.equal(string.rep("x", 4000), job.task)
      d:idle()
    end)
    assert.equal(1, #delivered)
  end)
end)

describe("scoped delegator jobs", function()
  it("F35: a valid job is delivered once; the author keeps principalId and tier member; run sees only channel, author and signal", function()
    local seen_task, seen_ctx
    local d, delivered = make {
      run = function(task, ctx)
        seen_task, seen_ctx = task, ctx
        return "the report"
      end,
    }
    local job
    async.run(function()
      job = d:start(request { title = "  Find sources  ", task = "\u{00A0} Find three sources. \n" })
      d:idle()
    end)
    assert.equal(1, job.id)
    assert.equal("fake:general", job.channel)
    assert.equal(TARGET, job.target)
    assert.same({ principalId = "p-ada", id = "u1", name = "Ada", tier = "member" }, job.author)
    assert.equal("Find sources", job.title)
    assert.equal("Find three sources.", job.task)
    assert.equal("number", type(job.startedAt))
    assert.equal(1, #delivered)
    assert.same(job, delivered[1].job)
    assert.same({ ok = true, report = "the report" }, delivered[1].outcome)
    assert.equal("Find three sources.", seen_task)
    local keys = {}
    for k in pairs(seen_ctx) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.same({ "author", "channel", "signal" }, keys)
    assert.equal("fake:general", seen_ctx.channel)
    assert.same({ id = "u1", name = "Ada", principalId = "p-ada" }, seen_ctx.author)
    assert.is_false(seen_ctx.signal.aborted)
  end)

  it("returns the record without yielding and starts the run on a later loop turn; ids count from 1", function()
    local ran = false
    local d = make { run = function() ran = true; return "r" end }
    async.run(function()
      local a = d:start(request())
      assert.is_false(ran)
      local b = d:start(request { channel = "fake:other" })
      assert.equal(1, a.id)
      assert.equal(2, b.id)
      assert.is_true(math.type(a.startedAt) == "integer")
      assert.is_true(a.startedAt >= (os.time() - 5) * 1000 and a.startedAt <= (os.time() + 5) * 1000)
      d:idle()
    end)
    assert.is_true(ran)
  end)

  it("F37: with maxRunning = 1 a second start in the channel is refused and running_channels() lists it", function()
    local gates = {}
    local d, delivered = make {
      maxRunning = 1,
      run = function() async.await(function(resume) gates[#gates + 1] = resume end); return "done" end,
    }
    async.run(function()
      d:start(request())
      assert.equal("this channel already has 1 delegated tasks running; wait for one to report back", refusal(d, request()))
      assert.same({ "fake:general" }, d:running_channels())
      -- The cap is per channel: another channel still starts.
      d:start(request { channel = "fake:other" })
      assert.same({ "fake:general", "fake:other" }, d:running_channels())
      wait_for(function() return #gates == 2 end)
      for _, release in ipairs(gates) do release() end
      d:idle()
    end)
    assert.equal(2, #delivered)
    assert.same({}, d:running_channels())
  end)

  it("lists a channel once per job, and counts N in the refusal", function()
    local gate = {}
    local d = make { run = function() async.await(function(resume) gate[#gate + 1] = resume end); return "x" end }
    async.run(function()
      d:start(request())
      d:start(request())
      assert.same({ "fake:general", "fake:general" }, d:running_channels())
      assert.equal("this channel already has 2 delegated tasks running; wait for one to report back", refusal(d, request()))
      wait_for(function() return #gate == 2 end)
      for _, r in ipairs(gate) do r() end
      d:idle()
    end)
  end)

  it("keeps a job tracked, and its slot busy, until deliver has returned", function()
    local release
    local d, delivered = make {
      maxRunning = 1,
      deliver = function(job, outcome)
        async.await(function(resume) release = resume end)
      end,
    }
    async.run(function()
      d:start(request())
      wait_for(function() return release ~= nil end)
      assert.same({ "fake:general" }, d:running_channels())
      assert.equal("this channel already has 1 delegated tasks running; wait for one to report back", refusal(d, request()))
      release()
      d:idle()
      assert.same({}, d:running_channels())
      d:start(request())
      release = nil
      wait_for(function() return release ~= nil end)
      release()
      d:idle()
    end)
    assert.equal(0, #delivered) -- this deliver records nothing
  end)

  it("F38: dispose() aborts the running job once, empties running_channels(), and later starts get the scope refusal", function()
    local aborts, reasons = 0, {}
    local d, delivered = make {
      run = function(_, ctx)
        ctx.signal:on_abort(function(reason) aborts = aborts + 1; reasons[#reasons + 1] = reason end)
        async.await(function(resume) ctx.signal:on_abort(resume) end)
        return "finished anyway"
      end,
    }
    async.run(function()
      d:start(request())
      assert.same({ "fake:general" }, d:running_channels())
      d:dispose()
      assert.same({}, d:running_channels())
      d:dispose() -- harmless
    end)
    assert.equal(1, aborts)
    assert.equal(1, #delivered)
    assert.same({ ok = false, error = "the worker ran out of time" }, delivered[1].outcome)
    assert.equal("Delegation scope refused", refusal(d, request()))
  end)

  it("dispose() still calls run with an aborted signal for a job that had not begun, and delivers it", function()
    local saw_aborted
    local d, delivered = make { run = function(_, ctx) saw_aborted = ctx.signal.aborted; return "r" end }
    async.run(function()
      d:start(request())
      d:dispose()
    end)
    assert.is_true(saw_aborted)
    assert.same({ ok = false, error = "the worker ran out of time" }, delivered[1].outcome)
  end)

  it("F39: a failed run is delivered scrubbed: `429 rate limited` stays, the password does not", function()
    local d, delivered = make {
      run = function()
        error({ message = "request to https://user:hunter2@api.example.com/v1 failed: 429 rate limited" })
      end,
    }
    async.run(function() d:start(request()); d:idle() end)
    assert.equal(1, #delivered)
    local outcome = delivered[1].outcome
    assert.is_false(outcome.ok)
    assert.is_truthy(outcome.error:find("429 rate limited", 1, true))
    assert.is_nil(outcome.error:find("hunter2", 1, true))
  end)

  it("F40: with timeoutMs = 1000 a run that hangs until its signal fires is delivered as out of time", function()
    local d, delivered = make {
      timeoutMs = 1000,
      run = function(_, ctx)
        async.await(function(resume) ctx.signal:on_abort(resume) end)
        return "a late report"
      end,
    }
    async.run(function() d:start(request()); d:idle() end)
    assert.same({ { job = delivered[1].job, outcome = { ok = false, error = "the worker ran out of time" } } }, delivered)
  end)

  it("F40: a run that raises the signal's reason after the deadline is also out of time", function()
    local d, delivered = make {
      timeoutMs = 1000,
      run = function(_, ctx)
        async.await(function(resume) ctx.signal:on_abort(resume) end)
        ctx.signal:throw_if_aborted()
      end,
    }
    async.run(function() d:start(request()); d:idle() end)
    assert.same({ ok = false, error = "the worker ran out of time" }, delivered[1].outcome)
  end)

  it("F42: maxReportChars = math.huge delivers a 100,000-character report; diagnosticChars = math.huge a 2,000-character error whole", function()
    local big = string.rep("r", 100000)
    local long_error = string.rep("e", 2000)
    local d, delivered = make { maxReportChars = math.huge, diagnosticChars = math.huge, run = function(task)
      if task == "fail" then error(long_error, 0) end
      return big
    end }
    async.run(function()
      d:start(request())
      d:start(request { task = "fail" })
      d:idle()
    end)
    table.sort(delivered, function(a, b) return a.job.id < b.job.id end)
    assert.same({ ok = true, report = big }, delivered[1].outcome)
    assert.same({ ok = false, error = long_error }, delivered[2].outcome)
  end)

  it("fails a report over maxReportChars code points, a non-string report and an invalid UTF-8 report", function()
    local reports = { ["long"] = utf8_chars(11), ["fit"] = utf8_chars(10), ["nil"] = nil, ["num"] = 42, ["bad"] = "ok\255" }
    local d, delivered = make { maxReportChars = 10, run = function(task) return reports[task] end }
    async.run(function()
      for _, t in ipairs { "long", "fit", "nil", "num", "bad" } do
        d:start(request { channel = "fake:" .. t, task = t })
      end
      d:idle()
    end)
    local by = {}
    for _, x in ipairs(delivered) do by[x.job.task] = x.outcome end
    assert.same({ ok = false, error = "Research report too large" }, by.long)
    assert.same({ ok = true, report = utf8_chars(10) }, by.fit)
    assert.same({ ok = false, error = "Research report too large" }, by["nil"])
    assert.same({ ok = false, error = "Research report too large" }, by.num)
    assert.same({ ok = false, error = "Research report is not valid UTF-8" }, by.bad)
  end)

  it("gives a raised table's message, tostring otherwise, bounded by diagnosticChars, and `the task failed` when empty", function()
    local errors = {
      msg = { message = "upstream said no" },
      str = "plain failure",
      tbl = setmetatable({}, { __tostring = function() return "custom error" end }),
      empty = { message = "  \n" },
      long = string.rep("z", 50),
      badts = setmetatable({}, { __tostring = function() error("boom") end }),
    }
    local d, delivered = make { diagnosticChars = 20, run = function(task) error(errors[task], 0) end }
    async.run(function()
      for name in pairs(errors) do d:start(request { channel = "fake:" .. name, task = name }) end
      d:idle()
    end)
    local by = {}
    for _, x in ipairs(delivered) do by[x.job.task] = x.outcome.error end
    assert.equal("upstream said no", by.msg)
    assert.equal("plain failure", by.str)
    assert.equal("custom error", by.tbl)
    assert.equal("the task failed", by.empty)
    assert.equal(string.rep("z", 19) .. "…", by.long)
    assert.equal("the task failed", by.badts)
  end)

  it("logs only the channel and job id when deliver raises, and untracks the job", function()
    local logger = new_logger()
    local d = make {
      logger = logger,
      deliver = function() error("secret-token-abc failed to post") end,
    }
    async.run(function() d:start(request()); d:idle() end)
    assert.same({ { message = "Sandbox task report failed", fields = { channel = "fake:general", job = 1 } } }, logger.entries)
    assert.same({}, d:running_channels())
  end)

  it("idle() waits for the jobs tracked when it is called, not for jobs started later", function()
    local gates = {}
    local d, delivered = make {
      run = function(task) async.await(function(resume) gates[task] = resume end); return task end,
    }
    local idle_done = false
    async.run(function()
      d:start(request { task = "first" })
      wait_for(function() return gates.first ~= nil end)
      local waiter = async.spawn(function() d:idle(); idle_done = true end)
      d:start(request { task = "second" })
      wait_for(function() return gates.second ~= nil end)
      gates.first()
      async.wait(waiter)
      assert.is_true(idle_done)
      assert.same({ "fake:general" }, d:running_channels())
      gates.second()
      d:idle()
    end)
    assert.equal(2, #delivered)
  end)

  it("idle() returns at once when nothing is tracked", function()
    local d = make()
    async.run(function() d:idle() end)
    d:idle() -- outside a task too, since it does not yield
  end)

  it("deliver is called after disposal too, for a job that finishes late", function()
    local d, delivered = make {
      run = function(_, ctx)
        async.await(function(resume) ctx.signal:on_abort(resume) end)
        error("cancelled")
      end,
    }
    async.run(function()
      d:start(request())
      d:start(request { channel = "fake:two" })
      d:dispose()
    end)
    assert.equal(2, #delivered)
    for _, x in ipairs(delivered) do
      assert.same({ ok = false, error = "the worker ran out of time" }, x.outcome)
    end
  end)
end)
