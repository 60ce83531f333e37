-- research_spec.lua: the research worker (lua/sandbox/delegator/research.lua; spec
-- fetch-and-delegation.md section 4; "Behaviours the specs must cover"
-- 44-46, item numbers in the `it` names as F<n>). The model runtime is a
-- scripted offline table; runs happen on the real loop through async.run.
-- Nothing here touches the network: the one safe_fetch call targets a
-- loopback literal, which is refused before any lookup or connection.
local async = require "sandbox.async"
local core = require "sandbox.core"
local delegator = require "sandbox.delegator"
local research = require "sandbox.delegator.research"
local sandbox = require "sandbox"
local signal = require "sandbox.signal"

---------------------------------------------------------------- helpers

-- An assistant message with the given text parts (stopReason "stop").
local function say(...)
  local content = {}
  for i, t in ipairs { ... } do content[i] = { type = "text", text = t } end
  return { role = "assistant", content = content, stopReason = "stop" }
end

-- An assistant message asking for tool calls: call("name", args, "name", args, ...).
local function call(...)
  local a = table.pack(...)
  local content = { { type = "thinking", thinking = "let me look" } }
  for i = 1, a.n, 2 do
    content[#content + 1] = { type = "toolCall", id = "call-" .. ((i + 1) // 2), name = a[i], arguments = a[i + 1] }
  end
  return { role = "assistant", content = content, stopReason = "toolUse" }
end

-- The scripted offline model runtime. Each step is an assistant message or
-- a function(request, signal, rt) returning one; rt.requests keeps every
-- request and rt.signals every signal complete saw.
local function scripted(steps)
  local rt = { requests = {}, signals = {}, found = {} }
  function rt:find_model(model)
    self.found[#self.found + 1] = model
    if model == "test/missing" then return nil end
    return { model = model }
  end
  function rt:complete(handle, request, sig)
    assert.equal("table", type(handle))
    self.requests[#self.requests + 1] = request
    self.signals[#self.signals + 1] = sig
    local step = steps[#self.requests]
    if type(step) == "function" then return step(request, sig, self) end
    if step == nil then error("the script has no step " .. #self.requests, 0) end
    return step
  end
  return rt
end

local function noop_search(query) return "answer for " .. query .. " (https://example.org/src)" end
local function noop_extract(result) return "text of " .. result.url end

-- Options of a default-mode worker; over overrides (false removes a key).
local function options(over)
  local o = {
    modelRuntime = scripted { say "done" },
    agentDir = "/var/lib/research/agent",
    workDir = "/var/lib/research/work",
    model = "test/model-1",
    thinking = "medium",
    search = noop_search,
    extractFetched = noop_extract,
  }
  for k, v in pairs(over or {}) do
    if v == false then o[k] = nil else o[k] = v end
  end
  return o
end

local function ctor_error(opts)
  local ok, err = pcall(research.new, opts)
  assert.is_false(ok, "new should fail")
  assert.equal("string", type(err))
  return err
end

-- Runs worker:run(task, sig) on the loop; returns ok, report-or-error.
local function run(worker, task, sig)
  return async.run(function()
    return pcall(worker.run, worker, task or "What is the tide?", sig)
  end)
end

local function report_of(worker, task, sig)
  local ok, res = run(worker, task, sig)
  assert.is_true(ok, "run failed: " .. tostring(res))
  return res
end

local function failure_of(worker, task, sig)
  local ok, err = run(worker, task, sig)
  assert.is_false(ok, "run should fail")
  return err
end

-- The tool results of a request's messages, in order.
local function tool_results(request)
  local out = {}
  for _, m in ipairs(request.messages) do
    if m.role == "toolResult" then out[#out + 1] = m end
  end
  return out
end

local function tool_names(request)
  local out = {}
  for i, t in ipairs(request.tools) do out[i] = t.name end
  return out
end

local function live_handlers(sig)
  local n = 0
  for _, h in ipairs(sig._handlers) do if h.fn then n = n + 1 end end
  return n
end

---------------------------------------------------------------- constructor

describe("research worker options", function()
  it("F44: a worker with no options is refused; fetchContent without search gets the search message", function()
    assert.equal("Research needs tools, fetchContent or extractFetched", ctor_error(nil))
    assert.equal("Research needs tools, fetchContent or extractFetched", ctor_error({}))
    assert.equal("Research needs search unless it has its own tools",
      ctor_error { fetchContent = function() return "" end })
    assert.equal("Research needs search unless it has its own tools",
      ctor_error(options { search = false, extractFetched = false, fetchContent = function() return "" end }))
  end)

  it("F44: tools = { toolNames = { \"fetch_content\" } } without search is accepted", function()
    local w = research.new(options {
      search = false, extractFetched = false, tools = { toolNames = { "fetch_content" } },
    })
    assert.equal("table", type(w))
    assert.equal("function", type(w.run))
  end)

  it("checks in order: a fetch option, then search, then the option types", function()
    -- every option wrong, and no fetch option: the first message
    assert.equal("Research needs tools, fetchContent or extractFetched", ctor_error {
      modelRuntime = 1, agentDir = 2, model = "nope", thinking = "max", search = "x",
    })
    -- a fetch option but no search: the second, despite the wrong types
    assert.equal("Research needs search unless it has its own tools", ctor_error {
      extractFetched = noop_extract, modelRuntime = 1, thinking = "max",
    })
    -- then the type checks, in the order of the 4.1 table
    assert.equal("Invalid research option modelRuntime",
      ctor_error(options { modelRuntime = 1, agentDir = 2, thinking = "max" }))
    assert.equal("Invalid research option agentDir", ctor_error(options { agentDir = 2, thinking = "max" }))
    assert.equal("Invalid research option thinking", ctor_error(options { thinking = "max", aborted = 3 }))
  end)

  it("refuses each option of the wrong type with Invalid research option <name>", function()
    local cases = {
      { "modelRuntime", { false, {}, "rt", { find_model = function() end }, { complete = function() end } } },
      { "agentDir", { false, 7, "" } },
      { "workDir", { false, {}, "" } },
      { "model", { false, 3, "no-slash", "/id", "provider/", "" } },
      { "thinking", { false, "max", "minimal", "off", "LOW", 1 } },
      { "search", { "search", {} } },
      { "extractFetched", { "x", 1 } },
      { "fetchContent", { true, {} } },
      { "tools", { "tools", 5 } },
      { "scope", { "scope", {} } },
      { "aborted", { "", 5, {} } },
    }
    for _, c in ipairs(cases) do
      local name, values = c[1], c[2]
      for _, v in ipairs(values) do
        assert.equal("Invalid research option " .. name, ctor_error(options { [name] = v }))
      end
    end
  end)

  it("refuses an empty tools.toolNames and bad tools fields", function()
    for _, names in ipairs { {}, { "" }, { 1 }, "web_search", { web = "web_search" } } do
      assert.equal("Invalid research option tools.toolNames", ctor_error(options { tools = { toolNames = names } }))
    end
    assert.equal("Invalid research option tools.toolNames", ctor_error(options { tools = {} }))
    assert.equal("Invalid research option tools.extensionPaths",
      ctor_error(options { tools = { toolNames = { "x" }, extensionPaths = { 3 } } }))
    assert.equal("Invalid research option tools.extensionFactories",
      ctor_error(options { tools = { toolNames = { "x" }, extensionFactories = { "f" } } }))
    assert.equal("Invalid research option tools.prompt",
      ctor_error(options { tools = { toolNames = { "x" }, prompt = 9 } }))
  end)

  it("accepts every thinking level and the default standing prompt", function()
    for _, level in ipairs { "low", "medium", "high", "xhigh" } do
      assert.equal(level, research.new(options { thinking = level }).thinking)
    end
    local w = research.new(options())
    assert.equal(research.RESEARCH_PROMPT, w.prompt)
    assert.equal("the worker ran out of time", w.aborted)
  end)

  it("is sandbox.research_worker", function()
    assert.equal(research.new, sandbox.research_worker)
  end)
end)

---------------------------------------------------------------- session

describe("research worker session", function()
  it("F45: the host's tools replace the built-in two, scope wraps the run, and an inactive tool never runs", function()
    local log, secret_ran = {}, false
    local rt = scripted {
      call("host_web", { q = "tides" }, "host_secret_tool", { what = "keys" }),
      function(request, _, self)
        log[#log + 1] = "model"
        local results = tool_results(request)
        return say("Report: " .. results[1].content[1].text)
      end,
    }
    local w = research.new(options {
      modelRuntime = rt, search = false, extractFetched = false,
      tools = {
        toolNames = { "host_web" },
        prompt = "Use host_web.",
        extensionFactories = { function(api)
          api.register_tool { name = "host_web", description = "host search",
            parameters = { type = "object", properties = { q = { type = "string" } } },
            execute = function(args) log[#log + 1] = "tool"; return "HOST-TOOL-OUTPUT for " .. args.q end }
          api.register_tool { name = "host_secret_tool", description = "secret",
            parameters = { type = "object" },
            execute = function() secret_ran = true; return "secret" end }
        end },
      },
      scope = function(fn)
        log[#log + 1] = "enter"
        local r = fn()
        log[#log + 1] = "exit"
        return r
      end,
    })
    local report = report_of(w, "Find tides")
    assert.equal("Report: HOST-TOOL-OUTPUT for tides", report)
    assert.same({ "enter", "tool", "model", "exit" }, log)
    assert.is_false(secret_ran)
    for _, request in ipairs(rt.requests) do
      assert.same({ "host_web" }, tool_names(request))
      assert.equal("Use host_web.", request.system)
      assert.equal("medium", request.thinking)
    end
    local results = tool_results(rt.requests[2])
    assert.equal(2, #results)
    assert.is_false(results[1].isError)
    assert.equal("call-2", results[2].toolCallId)
    assert.equal("host_secret_tool", results[2].toolName)
    assert.is_true(results[2].isError)
    assert.same({ { type = "text", text = "Tool host_secret_tool not found" } }, results[2].content)
    assert.same({ "test/model-1" }, rt.found)
  end)

  it("F46: a report longer than 20,000 code points keeps 20,000 and ends with the cut note", function()
    local long = string.rep("é", 25000)
    local w = research.new(options { modelRuntime = scripted { say(long) } })
    local report = report_of(w)
    assert.equal(string.rep("é", 20000) .. "\n\n[report cut at 20000 characters]", report)
    assert.is_true(report:sub(-#"[report cut at 20000 characters]") == "[report cut at 20000 characters]")
    -- exactly 20,000 stays whole
    local exact = string.rep("ü", 20000)
    assert.equal(exact, report_of(research.new(options { modelRuntime = scripted { say(exact) } })))
  end)

  it("sends the task as the prompt with the standing prompt, the thinking level and only the built-ins", function()
    local rt = scripted { say("  Tides are caused by the moon. https://example.org  ", "More.") }
    local w = research.new(options { modelRuntime = rt, thinking = "xhigh" })
    assert.equal("Tides are caused by the moon. https://example.org  \nMore.", report_of(w, "Why tides?"))
    local request = rt.requests[1]
    assert.same({ { role = "user", content = "Why tides?" } }, request.messages)
    assert.equal(research.RESEARCH_PROMPT, request.system)
    assert.equal("xhigh", request.thinking)
    assert.same({ "web_search", "fetch_content" }, tool_names(request))
    assert.equal("string", request.tools[1].parameters.properties.query.type)
    assert.matches("no shell", request.system, 1, true)
  end)

  it("raises ConfigError for a model the host does not have", function()
    local rt = scripted { say "unused" }
    local err = failure_of(research.new(options { modelRuntime = rt, model = "test/missing" }))
    assert.equal("ConfigError", err.name)
    assert.equal("model test/missing is not available on this host", err.message)
    assert.equal(err.message, tostring(err))
    assert.equal(0, #rt.requests)
  end)

  it("lets an error raised by complete fail the run", function()
    local rt = scripted { function() error({ message = "provider exploded" }, 0) end }
    local err = failure_of(research.new(options { modelRuntime = rt }))
    assert.equal("provider exploded", err.message)
  end)

  it("stops after 32 model calls with the run stopped with toolUse", function()
    local searches = 0
    local steps = {}
    for i = 1, 40 do steps[i] = call("web_search", { query = "q" .. i }) end
    local rt = scripted(steps)
    local w = research.new(options {
      modelRuntime = rt, search = function() searches = searches + 1; return "x" end,
    })
    local err = failure_of(w)
    assert.equal("the run stopped with toolUse", err.message)
    assert.equal(32, #rt.requests)
    assert.equal(31, searches)
  end)

  it("loads extensionPaths with loadfile and lets a guard factory block a call", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write([[
      local runs = 0
      return function(api)
        api.register_tool { name = "read_page", description = "reads a page",
          parameters = { type = "object", properties = { url = { type = "string" } } },
          execute = function(args) runs = runs + 1; return "page " .. args.url .. " #" .. runs end }
      end
    ]])
    f:close()
    local events = {}
    local guard = function(api)
      api.on("tool_call", function(event)
        events[#events + 1] = event
        if event.input.url:find("internal", 1, true) then
          return { block = true, reason = "That address is not allowed." }
        end
      end)
    end
    local rt = scripted {
      call("read_page", { url = "https://internal.example/" }, "read_page", { url = "https://ok.example/" }),
      say "done",
    }
    local w = research.new(options {
      modelRuntime = rt, search = false, extractFetched = false,
      tools = { extensionPaths = { path }, extensionFactories = { guard }, toolNames = { "read_page" } },
    })
    assert.equal("done", report_of(w))
    os.remove(path)
    local results = tool_results(rt.requests[2])
    assert.is_true(results[1].isError)
    assert.equal("That address is not allowed.", results[1].content[1].text)
    assert.is_false(results[2].isError)
    assert.equal("page https://ok.example/ #1", results[2].content[1].text)   -- the blocked call never ran
    assert.equal(2, #events)
    assert.same({ toolName = "read_page", toolCallId = "call-1", input = { url = "https://internal.example/" } }, events[1])
  end)

  it("blocks a call whose guard raises (fails closed)", function()
    local ran = false
    local rt = scripted { call("t", {}), say "done" }
    local w = research.new(options {
      modelRuntime = rt, search = false, extractFetched = false,
      tools = { toolNames = { "t" }, extensionFactories = { function(api)
        api.register_tool { name = "t", description = "t", parameters = { type = "object" },
          execute = function() ran = true; return "x" end }
        api.on("tool_call", function() error("guard broke", 0) end)
      end } },
    })
    assert.equal("done", report_of(w))
    assert.is_false(ran)
    local r = tool_results(rt.requests[2])[1]
    assert.is_true(r.isError)
    assert.equal("Extension failed, blocking execution: guard broke", r.content[1].text)
  end)

  it("turns a raised error, a non-string result and non-object arguments of a host tool into failed results", function()
    local rt = scripted {
      call("boom", {}, "nothing", {}, "boom", "not an object"),
      say "done",
    }
    local w = research.new(options {
      modelRuntime = rt, search = false, extractFetched = false,
      tools = { toolNames = { "boom", "nothing" }, extensionFactories = { function(api)
        api.register_tool { name = "boom", description = "b", parameters = { type = "object" },
          execute = function() error({ message = "upstream said no: https://user:hunter2@api.example/" }, 0) end }
        api.register_tool { name = "nothing", description = "n", parameters = { type = "object" },
          execute = function() return 42 end }
      end } },
    })
    assert.equal("done", report_of(w))
    local results = tool_results(rt.requests[2])
    assert.equal(3, #results)
    for _, r in ipairs(results) do assert.is_true(r.isError) end
    assert.matches("upstream said no", results[1].content[1].text, 1, true)
    assert.is_nil(results[1].content[1].text:find("hunter2", 1, true))
    assert.equal("Tool nothing returned no text", results[2].content[1].text)
    assert.equal("Invalid arguments for tool boom: expected an object", results[3].content[1].text)
  end)
end)

---------------------------------------------------------------- outcomes

describe("research worker outcome (4.4 step 4, in order)", function()
  local function outcome(reply, over)
    local o = { modelRuntime = scripted { reply } }
    for k, v in pairs(over or {}) do o[k] = v end
    return failure_of(research.new(options(o))).message
  end

  it("no assistant message: the run produced no assistant message", function()
    assert.equal("the run produced no assistant message", outcome(function() return nil end))
    assert.equal("the run produced no assistant message",
      outcome({ role = "user", content = "hi", stopReason = "stop" }))
  end)

  it("stop reason aborted gives the aborted text, before the error and stop-reason rules", function()
    assert.equal("the worker ran out of time",
      outcome({ role = "assistant", content = {}, stopReason = "aborted", errorMessage = "x" }))
    assert.equal("took too long",
      outcome({ role = "assistant", content = {}, stopReason = "aborted" }, { aborted = "took too long" }))
  end)

  it("stop reason error gives the provider's error message", function()
    assert.equal("429 rate limited by provider",
      outcome({ role = "assistant", content = { { type = "text", text = "partial" } },
                stopReason = "error", errorMessage = "429 rate limited by provider" }))
  end)

  it("any other stop reason gives the run stopped with <reason>", function()
    assert.equal("the run stopped with length",
      outcome({ role = "assistant", content = { { type = "text", text = "half an answ" } }, stopReason = "length" }))
  end)

  it("empty or white-space text gives the worker's answer is empty", function()
    assert.equal("the worker's answer is empty", outcome(say()))
    assert.equal("the worker's answer is empty", outcome(say(" \n\t", "\u{3000}")))
    assert.equal("the worker's answer is empty",
      outcome({ role = "assistant", content = { { type = "thinking", thinking = "hmm" } }, stopReason = "stop" }))
  end)

  it("reads the last assistant message only", function()
    local rt = scripted { call("web_search", { query = "q" }), say "final answer" }
    assert.equal("final answer", report_of(research.new(options { modelRuntime = rt })))
  end)
end)

---------------------------------------------------------------- signals

describe("research worker signals and disposal", function()
  it("raises the signal's reason when it is aborted at the start, before loading anything", function()
    local sig = signal.new()
    sig:abort("turn ended")
    local loaded = false
    local rt = scripted { say "unused" }
    local w = research.new(options {
      modelRuntime = rt, search = false, extractFetched = false,
      tools = { toolNames = { "x" }, extensionFactories = { function() loaded = true end } },
    })
    assert.equal("turn ended", failure_of(w, "task", sig))
    assert.is_false(loaded)
    assert.same({}, rt.found)
  end)

  it("raises the signal's reason when it fires while resources load", function()
    local sig = signal.new()
    local rt = scripted { say "unused" }
    local w = research.new(options {
      modelRuntime = rt, search = false, extractFetched = false,
      tools = { toolNames = { "x" }, extensionFactories = { function() sig:abort("deadline") end } },
    })
    assert.equal("deadline", failure_of(w, "task", sig))
    assert.same({}, rt.found)
    assert.equal(0, #rt.requests)
  end)

  it("an abort during complete ends with the aborted text, and a cooperative runtime sees its signal fire", function()
    local sig = signal.new()
    local rt = scripted { function(_, call_sig)
      core.timer(1, function() sig:abort("deadline") end)
      return async.await(function(resume)
        call_sig:on_abort(function() resume({ role = "assistant", content = {}, stopReason = "aborted" }) end)
      end)
    end }
    local err = failure_of(research.new(options { modelRuntime = rt }), "task", sig)
    assert.equal("the worker ran out of time", err.message)
    assert.is_true(rt.signals[1].aborted)
    assert.equal("deadline", rt.signals[1].reason)
    assert.equal(1, #rt.requests)
  end)

  it("an abort during a complete that ignores its signal still ends the run, with the custom aborted text", function()
    local sig = signal.new()
    local rt = scripted { function()
      core.timer(1, function() sig:abort("deadline") end)
      return async.await(function() end)   -- never answers
    end }
    local err = failure_of(research.new(options { modelRuntime = rt, aborted = "research took too long" }), "task", sig)
    assert.equal("research took too long", err.message)
    assert.is_true(rt.signals[1].aborted)
  end)

  it("an abort during a tool ends with the aborted text, aborts the tool's signal and calls nothing more", function()
    local sig = signal.new()
    local tool_sig
    local rt = scripted {
      call("web_search", { query = "slow" }, "fetch_content", { url = "https://example.org/" }),
      say "never reached",
    }
    local fetched = false
    local w = research.new(options {
      modelRuntime = rt,
      search = function(_, s)
        tool_sig = s
        core.timer(1, function() sig:abort("disposed") end)
        return async.await(function() end)   -- ignores its signal
      end,
      fetchContent = function() fetched = true; return "x" end,
    })
    local err = failure_of(w, "task", sig)
    assert.equal("the worker ran out of time", err.message)
    assert.is_true(tool_sig.aborted)
    assert.equal("disposed", tool_sig.reason)
    assert.is_false(fetched)
    assert.equal(1, #rt.requests)
  end)

  it("disposes the session after a successful run: nothing stays linked to the run's signal", function()
    local sig = signal.new()
    local seen
    local rt = scripted { call("web_search", { query = "q" }), say "ok" }
    local w = research.new(options { modelRuntime = rt, search = function(_, s) seen = s; return "r" end })
    assert.equal("ok", report_of(w, "task", sig))
    assert.equal(0, live_handlers(sig))
    assert.is_false(sig.aborted)
    assert.is_false(seen.aborted)   -- it had returned before the session closed
    assert.is_true(rt.signals[2].aborted == false)
  end)

  it("disposes the session after a failed run too", function()
    local sig = signal.new()
    local rt = scripted { function() error("boom", 0) end }
    assert.equal("boom", failure_of(research.new(options { modelRuntime = rt }), "task", sig))
    assert.equal(0, live_handlers(sig))
  end)
end)

---------------------------------------------------------------- built-in tools

describe("research worker built-in tools (4.3)", function()
  it("web_search takes 1 to 4,000 code points and hands search the combined signal", function()
    local queries, signals_seen = {}, {}
    local ok_query = string.rep("ß", 4000)
    local rt = scripted {
      call("web_search", { query = "" }, "web_search", { query = string.rep("ß", 4001) },
           "web_search", { query = 7 }, "web_search", {}, "web_search", { query = ok_query }),
      say "done",
    }
    local sig = signal.new()
    local w = research.new(options {
      modelRuntime = rt,
      search = function(q, s) queries[#queries + 1] = q; signals_seen[#signals_seen + 1] = s; return "found" end,
    })
    assert.equal("done", report_of(w, "task", sig))
    assert.same({ ok_query }, queries)
    local results = tool_results(rt.requests[2])
    for i = 1, 4 do
      assert.is_true(results[i].isError)
      assert.equal("query must be a string of 1 to 4000 characters", results[i].content[1].text)
    end
    assert.is_false(results[5].isError)
    assert.equal("found", results[5].content[1].text)
    -- each call gets its own signal, not the run's
    assert.are_not.equal(sig, signals_seen[1])
    assert.is_false(signals_seen[1].aborted)
  end)

  it("the per-call signal of web_search aborts with the run's signal", function()
    local sig = signal.new()
    local fired
    local w = research.new(options {
      modelRuntime = scripted { call("web_search", { query = "q" }), say "x" },
      search = function(_, s)
        s:on_abort(function(reason) fired = reason end)
        sig:abort("run over")
        return "r"
      end,
    })
    assert.equal("the worker ran out of time", failure_of(w, "task", sig).message)
    assert.equal("run over", fired)
  end)

  it("fetch_content takes 1 to 8,000 code points and uses fetchContent when given", function()
    local urls = {}
    local ok_url = "https://example.org/" .. string.rep("ä", 8000 - 20)
    local rt = scripted {
      call("fetch_content", { url = "" }, "fetch_content", { url = ok_url .. "x" },
           "fetch_content", { url = false }, "fetch_content", { url = ok_url }),
      say "done",
    }
    local extracted = false
    local w = research.new(options {
      modelRuntime = rt,
      fetchContent = function(url) urls[#urls + 1] = url; return "page text" end,
      extractFetched = function() extracted = true; return "no" end,
    })
    assert.equal("done", report_of(w))
    assert.same({ ok_url }, urls)
    assert.is_false(extracted)
    local results = tool_results(rt.requests[2])
    for i = 1, 3 do
      assert.is_true(results[i].isError)
      assert.equal("url must be a string of 1 to 8000 characters", results[i].content[1].text)
    end
    assert.is_false(results[4].isError)
    assert.equal("page text", results[4].content[1].text)
  end)

  it("failed search and fetchContent calls are failed results the model sees; the run goes on", function()
    local rt = scripted {
      call("web_search", { query = "q" }, "fetch_content", { url = "https://a.example/" },
           "web_search", { query = "r" }),
      say "done anyway",
    }
    local n = 0
    local w = research.new(options {
      modelRuntime = rt,
      search = function() n = n + 1; if n == 1 then error("search quota exceeded", 0) end; return { "not text" } end,
      fetchContent = function() error({ name = "UnsafeUrlError", message = "That address is not allowed." }, 0) end,
    })
    assert.equal("done anyway", report_of(w))
    local results = tool_results(rt.requests[2])
    assert.equal("search quota exceeded", results[1].content[1].text)
    assert.equal("That address is not allowed.", results[2].content[1].text)
    assert.equal("Tool web_search returned no text", results[3].content[1].text)
    for _, r in ipairs(results) do assert.is_true(r.isError) end
  end)

  it("fetch_content through safe_fetch refuses http://127.0.0.1/ as non-public; extractFetched never runs", function()
    local extracted = false
    local rt = scripted { call("fetch_content", { url = "http://127.0.0.1/" }), say "could not fetch" }
    local w = research.new(options {
      modelRuntime = rt, extractFetched = function() extracted = true; return "x" end,
    })
    assert.equal("could not fetch", report_of(w))
    assert.is_false(extracted)
    local r = tool_results(rt.requests[2])[1]
    assert.is_true(r.isError)
    assert.equal("fetch_content", r.toolName)
    assert.equal("URL resolves to a non-public address", r.content[1].text)
  end)

  it("a call to a tool outside the two built-ins gets Tool <name> not found", function()
    local rt = scripted { call("bash", { command = "id" }, "read", { path = "/etc/passwd" }), say "ok" }
    assert.equal("ok", report_of(research.new(options { modelRuntime = rt })))
    local results = tool_results(rt.requests[2])
    assert.equal("Tool bash not found", results[1].content[1].text)
    assert.equal("Tool read not found", results[2].content[1].text)
  end)
end)

---------------------------------------------------------------- as the delegator's run

describe("research worker as the scoped delegator's run", function()
  local function new_logger()
    local log = { entries = {} }
    log.error = function(message, fields) log.entries[#log.entries + 1] = { message = message, fields = fields } end
    return log
  end

  local function request(task)
    return {
      channel = "fake:general", target = "research",
      author = { id = "u1", name = "Ada", principalId = "p-ada", tier = "member" },
      title = "Tides", task = task,
    }
  end

  it("runs a delegated task end to end and delivers the report to the channel that asked", function()
    local rt = scripted {
      call("web_search", { query = "tides moon" }),
      function(req) return say("Tides: " .. tool_results(req)[1].content[1].text) end,
    }
    local worker = sandbox.research_worker(options { modelRuntime = rt })
    local delivered = {}
    local d = delegator.new {
      target = "research",
      run = function(task, ctx) return worker:run(task, ctx.signal) end,
      deliver = function(job, outcome) delivered[#delivered + 1] = { job = job, outcome = outcome } end,
      logger = new_logger(),
    }
    async.run(function()
      d:start(request("  Why do tides happen?  "))
      d:idle()
    end)
    assert.equal(1, #delivered)
    assert.equal("fake:general", delivered[1].job.channel)
    assert.same({ ok = true, report = "Tides: answer for tides moon (https://example.org/src)" }, delivered[1].outcome)
    assert.equal("Why do tides happen?", rt.requests[1].messages[1].content)
  end)

  it("a run past the delegator's deadline is delivered as the worker ran out of time", function()
    local rt = scripted { function() return async.await(function() end) end }
    local worker = research.new(options { modelRuntime = rt })
    local delivered = {}
    local d = delegator.new {
      target = "research", timeoutMs = 1000,
      run = function(task, ctx) return worker:run(task, ctx.signal) end,
      deliver = function(job, outcome) delivered[#delivered + 1] = outcome end,
      logger = new_logger(),
    }
    async.run(function()
      d:start(request("hang"))
      d:idle()
    end)
    assert.same({ { ok = false, error = "the worker ran out of time" } }, delivered)
    assert.is_true(rt.signals[1].aborted)
  end)

  it("dispose() ends a running research job", function()
    local rt = scripted { function(_, s) return async.await(function(resume)
      s:on_abort(function() resume({ role = "assistant", content = {}, stopReason = "aborted" }) end)
    end) end }
    local worker = research.new(options { modelRuntime = rt })
    local delivered = {}
    local d = delegator.new {
      target = "research",
      run = function(task, ctx) return worker:run(task, ctx.signal) end,
      deliver = function(_, outcome) delivered[#delivered + 1] = outcome end,
      logger = new_logger(),
    }
    async.run(function()
      d:start(request("long"))
      while #rt.requests == 0 do async.sleep(1) end
      d:dispose()
    end)
    assert.same({ { ok = false, error = "the worker ran out of time" } }, delivered)
    assert.same({}, d:running_channels())
  end)
end)
