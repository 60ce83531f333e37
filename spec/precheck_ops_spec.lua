-- precheck_ops_spec.lua: the precheck runner's operator log and audit
-- (spec/operations.md 2-3 applied to lua/sandbox/precheck): one payload-free
-- audit line per precheck broker request, with the refusal reasons of its
-- rows, and one `precheck finished` line per run whose reason the host
-- decides (a script cannot relabel its own failure). Runs go through the
-- driver seam (a fake container that calls the run's real broker over its
-- Unix socket), with a real MCP server on the official SDK behind it.
local async = require "sandbox.async"
local P = require "precheck_harness"
local sandbox = require "sandbox"

local run = async.run
local F = P.fixture()
local ok_mcp, why_mcp, root = F.ok, F.why, F.root
local server
local ANSWER_OK = '{"ok":true,"result":{"wake":false}}'

setup(function()
  F.setup()
  server = F.server
end)
teardown(F.teardown)

-- A `logger` option that keeps {level, msg, fields} in order.
local function capture()
  local got = {}
  local function at(level) return function(msg, fields) got[#got + 1] = { level = level, msg = msg, f = fields } end end
  return got, { debug = at("debug"), info = at("info"), warn = at("warn"), error = at("error") }
end

local function lines_of(got, msg)
  local out = {}
  for _, l in ipairs(got) do if l.msg == msg then out[#out + 1] = l end end
  return out
end

local function grant(token)
  return function()
    return {
      { name = "health", url = server.url, tools = { "garmin-login", "garmin-get-hrv" }, token = token },
      { name = "google", url = server.url, tools = { "send" } },
    }
  end
end

local function no_secrets(got)
  for _, l in ipairs(got) do
    for k, v in pairs(l.f) do
      local s = tostring(v)
      assert.is_nil(s:find(P.TOKEN, 1, true), k)
      assert.is_nil(s:find(server.url, 1, true), k)
      assert.is_nil(s:find("2026-10-04", 1, true), k)   -- a tool argument
    end
  end
end

describe("precheck runner: operator log and audit (operations.md 2-3)", function()
  if not ok_mcp then pending(why_mcp) return end

  it("writes one audit line per broker request with its refusal reason, and one precheck finished line", function()
    local got, logger = capture()
    local d = P.driver(function(spec)
      P.run_post(spec, "/mcp/health", P.call_body("garmin-login"))                          -- row 10
      P.run_post(spec, "/mcp/google", P.call_body("send"))                                  -- not granted
      P.run_post(spec, "/mcp/health", '{"jsonrpc":"2.0","id":1,"method":"tools/list"}')     -- row 10
      P.run_post(spec, "/mcp/health", P.call_body("garmin-get-hrv", '{"date":"2026-10-04"}'))
      return ANSWER_OK
    end)
    local r = sandbox.precheckScriptRunner(P.options(root(), grant(function() return P.TOKEN end),
      { driver = d, logger = logger }))
    run(function()
      r.run("export default () => 1", P.context { tools = { { server = "health", tool = "garmin-get-hrv" } } })
    end)
    local refused = lines_of(got, "broker refused")
    assert.equal(3, #refused)
    assert.equal("warn", refused[1].level)
    assert.same({ "/mcp/health", 403, "payload" }, { refused[1].f.route, refused[1].f.status, refused[1].f.reason })
    assert.same({ "-", 404, "unknown_route" }, { refused[2].f.route, refused[2].f.status, refused[2].f.reason })
    assert.same({ "/mcp/health", 403, "payload" }, { refused[3].f.route, refused[3].f.status, refused[3].f.reason })
    local calls = lines_of(got, "broker call")
    assert.equal(1, #calls)
    assert.equal("info", calls[1].level)
    assert.equal(200, calls[1].f.status)
    assert.equal(200, calls[1].f.upstream_status)
    assert.equal("discord:guild:1", calls[1].f.channel)
    local fin = lines_of(got, "precheck finished")
    assert.equal(1, #fin)
    assert.equal("info", fin[1].level)
    assert.equal("ok", fin[1].f.reason)
    assert.equal(13, fin[1].f.schedule)
    assert.equal(3, fin[1].f.mcp_calls)            -- accepted by the listener (two refused at row 10)
    assert.equal(3, fin[1].f.refused_calls)
    assert.truthy(fin[1].f.turn:find("^%x+$"))
    for _, l in ipairs(refused) do assert.equal(fin[1].f.turn, l.f.turn) end
    assert.equal(fin[1].f.turn, calls[1].f.turn)
    no_secrets(got)
  end)

  it("names the listener's refusal reasons of rows 0-7 (method, query, credential_header, header, busy, budget)", function()
    local got, logger = capture()
    local H = require "broker_harness"
    local std = { { "Host", "broker" }, { "Content-Type", "application/json" }, { "Authorization", H.DUMMY } }
    local d = P.driver(function(spec)
      local sock = spec.runDir .. "/broker.sock"
      local body = P.call_body("garmin-get-hrv")
      P.send(sock, H.raw("/mcp/health", body, nil, { method = "GET" }))
      P.send(sock, H.raw("/mcp/health?x=1", body))
      P.send(sock, H.raw("/mcp/health", body, { std[1], std[2], { "Authorization", "Bearer sk-guess" } }))
      P.send(sock, H.raw("/mcp/health", body, { std[1], std[2], std[3], { "X-Forwarded-For", "1.2.3.4" } }))
      P.send(sock, "GARBAGE\r\n\r\n")
      P.run_post(spec, "/mcp/health", body)        -- spends the budget of 1
      P.run_post(spec, "/mcp/health", body)
      return ANSWER_OK
    end)
    local r = sandbox.precheckScriptRunner(P.options(root(), grant(nil), { driver = d, logger = logger, maxCalls = 1 }))
    run(function() r.run("x", P.context { tools = { { server = "health", tool = "garmin-get-hrv" } } }) end)
    local refused = lines_of(got, "broker refused")
    local reasons = {}
    for i, l in ipairs(refused) do reasons[i] = l.f.reason .. ":" .. l.f.status end
    assert.same({ "method:404", "query:404", "credential_header:404", "header:403", "method:400", "budget:429" }, reasons)
    assert.equal("x-forwarded-for", refused[4].f.header:lower())
    assert.equal("/mcp/health", refused[4].f.route)                 -- a known route refused later
    assert.equal("-", refused[2].f.route)
    for _, l in ipairs(got) do
      for _, v in pairs(l.f) do assert.is_nil(tostring(v):find("sk-guess", 1, true)) end
    end
  end)

  it("records a token hook that raises as credential_error and one that returns a bad value as credential_missing", function()
    for _, case in ipairs {
      { hook = function() error("vault down: secret-path") end, reason = "credential_error" },
      { hook = function() return "bad\ntoken" end, reason = "credential_missing" },
    } do
      local got, logger = capture()
      local d = P.driver(function(spec)
        P.run_post(spec, "/mcp/health", P.call_body("garmin-get-hrv", '{"date":"2026-10-04"}'))
        return ANSWER_OK
      end)
      local r = sandbox.precheckScriptRunner(P.options(root(), grant(case.hook), { driver = d, logger = logger }))
      run(function()
        r.run("x", P.context { tools = { { server = "health", tool = "garmin-get-hrv" } } })
      end)
      local calls = lines_of(got, "broker call")
      assert.equal(1, #calls, case.reason)
      assert.equal("warn", calls[1].level)
      assert.equal(502, calls[1].f.status)
      assert.equal(case.reason, calls[1].f.reason)
      for _, l in ipairs(got) do
        for _, v in pairs(l.f) do assert.is_nil(tostring(v):find("secret-path", 1, true)) end
      end
    end
  end)

  it("names an upstream's non-2xx as upstream_status with its status (/raw with nothing queued answers 500)", function()
    local got, logger = capture()
    local d = P.driver(function(spec)
      P.run_post(spec, "/mcp/health", P.call_body("garmin-get-hrv"))
      return ANSWER_OK
    end)
    local r = sandbox.precheckScriptRunner(P.options(root(), function()
      return { { name = "health", url = server.raw_url, tools = { "garmin-get-hrv" } } }
    end, { driver = d, logger = logger }))
    run(function() r.run("x", P.context { tools = { { server = "health", tool = "garmin-get-hrv" } } }) end)
    local calls = lines_of(got, "broker call")
    assert.equal(1, #calls)
    assert.equal(502, calls[1].f.status)
    assert.equal("upstream_status", calls[1].f.reason)
    assert.equal(500, calls[1].f.upstream_status)
  end)

  it("decides the run's reason itself: a script that answers the timeout's text is script_error, and its text is not logged", function()
    local got, logger = capture()
    local r = sandbox.precheckScriptRunner(P.options(root(), {}, {
      driver = P.driver(P.answer('{"ok":false,"error":"precheck script timed out"}')), logger = logger }))
    local ok, err = pcall(run, function() return r.run("x", P.context()) end)
    assert.is_false(ok)
    assert.equal("precheck script timed out", err)        -- the core still gets the script's text
    local fin = lines_of(got, "precheck finished")
    assert.equal(1, #fin)
    assert.equal("warn", fin[1].level)
    assert.equal("script_error", fin[1].f.reason)
    for _, l in ipairs(got) do
      for _, v in pairs(l.f) do assert.is_nil(tostring(v):find("timed out", 1, true)) end
    end
    -- and counts like a sealed turn, in the same family, with its mode
    local text = r.metrics()
    assert.truthy(text:find('\nsbx_turns_total{mode="precheck",reason="script_error"} 1\n', 1, true))
    assert.truthy(text:find('\nsbx_turns_total{mode="precheck",reason="ok"} 0\n', 1, true))
    assert.truthy(text:find('\nsbx_turn_duration_seconds_count{mode="precheck"} 1\n', 1, true))
  end)

  it("reports the backstop as deadline with its fix, the core's abort as stopped, unreadable stdout as invalid_reply", function()
    local function waits(_, _, sig)
      async.await(function(resume) sig:on_abort(resume) end)
      error(sig.reason, 0)
    end
    local got, logger = capture()
    local r = sandbox.precheckScriptRunner(P.options(root(), {}, { driver = P.driver(waits), timeoutMs = 1000, logger = logger }))
    pcall(run, function() return r.run("x", P.context()) end)
    local sig = require("sandbox.signal").new()
    r = sandbox.precheckScriptRunner(P.options(root(), {}, { driver = P.driver(function(spec, input, run_sig)
      require("sandbox.core").timer(20, function() sig:abort("host stopped") end)
      return waits(spec, input, run_sig)
    end), logger = logger }))
    pcall(run, function() return r.run("x", P.context { signal = sig }) end)
    r = sandbox.precheckScriptRunner(P.options(root(), {}, { driver = P.driver(P.answer("noise")), logger = logger }))
    pcall(run, function() return r.run("x", P.context()) end)
    local fin = lines_of(got, "precheck finished")
    assert.equal(3, #fin)
    assert.equal("deadline", fin[1].f.reason)
    assert.truthy(fin[1].f.fix:find("timeoutMs", 1, true))
    assert.equal("stopped", fin[2].f.reason)
    assert.equal("invalid_reply", fin[3].f.reason)
    assert.truthy(fin[3].f.fix)
  end)

  it("audit = false drops the broker lines and keeps the run's line", function()
    local got, logger = capture()
    local d = P.driver(function(spec)
      P.run_post(spec, "/mcp/google", P.call_body("send"))
      return ANSWER_OK
    end)
    local r = sandbox.precheckScriptRunner(P.options(root(), grant(nil), { driver = d, logger = logger, audit = false }))
    run(function() r.run("x", P.context()) end)
    assert.equal(0, #lines_of(got, "broker refused"))
    assert.equal(1, #lines_of(got, "precheck finished"))
  end)

  it("checks the log options with sandbox{}'s own errors", function()
    local d = P.driver(P.answer(ANSWER_OK))
    local function err_of(over)
      over.driver = d
      local ok, e = pcall(sandbox.precheckScriptRunner, P.options(root(), {}, over))
      assert.is_false(ok)
      return e
    end
    local errors = require "sandbox.errors"
    assert.equal(errors.LOG_LEVEL, err_of { logLevel = "loud" })
    assert.equal(errors.LOG_FORMAT, err_of { logFormat = "xml" })
    assert.equal(errors.AUDIT, err_of { audit = "no" })
    assert.equal(errors.LOGGER, err_of { logger = "stderr" })
  end)
end)
