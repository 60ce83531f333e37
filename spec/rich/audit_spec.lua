-- rich/audit_spec.lua: rich mode's operator lines go through the engine's one
-- logger (sandbox/log.lua) and every broker request the audit covers writes
-- one payload-free audit line (spec/operations.md 2-3, through
-- sandbox/ops/lines.lua), each refusal reason produced by a real hostile
-- request on a rich broker's real socket; the worker transport writes none.
local async = require "sandbox.async"
local harness = require "rich_harness"
local json = require "sandbox.json"
local peer = require "rich_peer"
local rich = require "sandbox.rich"
local signal = require "sandbox.signal"
local spec_fs = require "spec_fs"
local unix_request = require "unix_request"
local upstream = require "anthropic_upstream"

local SECRET = harness.SECRET
local GUEST = "guest-text-9f3e-never-logged"

local function run(fn) return async.run(fn) end

-- The audit lines ("broker call" / "broker refused") a harness logged.
local function audits(h)
  local out = {}
  for _, l in ipairs(h.logs) do
    if l.msg == "broker call" or l.msg == "broker refused" then out[#out + 1] = l end
  end
  return out
end

local function last(h) local a = audits(h) return a[#a] end

local function body(content) return { messages = { { role = "user", content = content or GUEST } } } end

describe("rich broker: one audit line per request (operations.md 3)", function()
  local up, h
  setup(function() up = upstream.start() end)
  teardown(function() up:stop() end)
  before_each(function() async.run(function() up:reset() end) end)
  after_each(function() if h then h:stop() h = nil end end)

  it("an accepted model call is one info line with its route, status, upstream status and sizes", function()
    h = harness.new { up = up }
    run(function()
      h:bind { channel = "discord:party", turnId = "t1" }
      assert.equal(200, h:model(body()).status)
    end)
    local a = audits(h)
    assert.equal(1, #a)
    assert.equal("info", a[1].level)
    assert.equal("broker call", a[1].msg)
    local f = a[1].fields
    assert.same({ "discord:party", "t1", "/anthropic/v1/messages", 200, 200 },
      { f.channel, f.turn, f.route, f.status, f.upstream_status })
    assert.is_nil(f.reason)
    assert.is_true(f.bytes_in > 0 and f.bytes_out > 0)
    assert.is_number(f.ms)
  end)

  it("each refusal reason comes from a real hostile request, with the route only when configured", function()
    local gate = signal.new()
    h = harness.new { up = up, seams = { headerTimeoutMs = 100 }, over = {
      oauthToken = function(scope) if scope.speaker.principalId == "nokey" then return nil end return SECRET end,
      tools = { names = { "wait" }, call = function()
        async.await(function(resume) gate:on_abort(resume) end)
        return { ok = true, text = "done" }
      end } } }
    local function expect(reason, status, route)
      local l = last(h)
      assert.equal("broker refused", l.msg, reason)
      assert.equal("warn", l.level)
      assert.same({ reason, status, route }, { l.fields.reason, l.fields.status, l.fields.route })
    end
    run(function()
      -- the startup scope (no turn bound) carries no model call
      assert.equal(410, h:model(body()).status)
      expect("not_bound", 410, "/anthropic/v1/messages")
      local release = h:bind()
      assert.equal(404, h:model(body(), nil, "/anthropic/v1/messages?endpoint=other").status)
      expect("query", 404, "-")
      assert.equal(404, h:post("/tools/shell", { input = {} }).status)
      expect("unknown_route", 404, "-")
      assert.equal(404, h:get("/anthropic/v1/messages").status)
      expect("method", 404, "/anthropic/v1/messages")
      assert.equal(404, h:post("/mcp/owner", { jsonrpc = "2.0", method = "ping", id = 1 }).status)
      expect("unknown_route", 404, "-")
      assert.equal(400, h:model(nil, { "X-App: a", "x-app: b" }).status)
      expect("header", 400, "-")
      assert.equal(400, h:post("/anthropic/v1/messages", "[1]").status)
      expect("malformed_json", 400, "/anthropic/v1/messages")
      local big = peer.raw(h.sock, "POST /anthropic/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 200000000\r\n\r\n")
      assert.equal(400, peer.parse(big.data).status)
      expect("body_too_large", 400, "/anthropic/v1/messages")
      assert.equal(400, h:model({ messages = { { role = "developer", content = GUEST } } }).status)
      expect("payload", 400, "/anthropic/v1/messages")
      -- four calls in flight, then a fifth
      local waiting = {}
      for i = 1, 4 do waiting[i] = async.spawn(function() return h:post("/tools/wait", { input = {} }) end) end
      harness.eventually(function() return h.b:stats().active == 4 end)
      assert.equal(429, h:post("/tools/wait", { input = {} }).status)
      expect("busy", 429, "/tools/wait")
      gate:abort("go")
      for i = 1, 4 do async.wait(waiting[i]) end
      release()
      assert.equal(410, h:model(body()).status)
      expect("after_turn", 410, "-")
      -- a head that never completes, and the 17th connection
      local got
      unix_request(h.sock, "POST /anthropic/v1/messages HTTP/1.1\r\n", { keep_open = true, timeout_ms = 5000 }, function(r) got = r end)
      harness.eventually(function() return got ~= nil end)
      expect("header_deadline", 0, "-")
    end)
    h:stop()
    h = harness.new { up = up, over = { maxCalls = 1 } }
    run(function()
      h:bind()
      assert.equal(200, h:model(body()).status)
      assert.equal(429, h:model(body()).status)
      expect("budget", 429, "/anthropic/v1/messages")
      local held = {}
      for i = 1, 16 do
        held[i] = unix_request(h.sock, "GET /worker/next HTTP/1.1\r\n", { keep_open = true, timeout_ms = 20000 }, function() end)
      end
      harness.eventually(function() return h.b.server:stats().connections == 16 end)
      peer.raw(h.sock, peer.bytes("GET", "/mcp-tools"))
      harness.eventually(function() return last(h).fields.reason == "connections" end)
      expect("connections", 0, "-")
      for _, x in ipairs(held) do x:close() end
    end)
  end)

  it("an accepted call that failed is a warn line with the host's reason", function()
    h = harness.new { up = up, over = { upstreamRetries = 0, oauthToken = function(scope)
      if scope.speaker.principalId == "nokey" then return nil end
      if scope.speaker.principalId == "raises" then error("vault down") end
      return SECRET
    end } }
    local function expect(reason, status)
      local l = last(h)
      assert.equal("broker call", l.msg, reason)
      assert.equal("warn", l.level)
      assert.same({ reason, status, "/anthropic/v1/messages" }, { l.fields.reason, l.fields.status, l.fields.route })
    end
    run(function()
      local release = h:bind { speaker = { id = "1", name = "N", principalId = "nokey" } }
      assert.equal(502, h:model(body()).status)
      expect("credential_missing", 502)
      release()
      release = h:bind { speaker = { id = "2", name = "R", principalId = "raises" } }
      assert.equal(502, h:model(body()).status)
      expect("credential_error", 502)
      release()
      h:bind()
      up:push { { raw = "{\"echo\":\"" .. SECRET .. "\"}", status = 200 } }
      h:model(body())
      expect("reflection", 200)
      up:push { { raw = "moved", status = 302, headers = { location = "https://elsewhere.example/" } } }
      assert.equal(502, h:model(body()).status)
      expect("upstream_invalid", 502)
      assert.equal(302, last(h).fields.upstream_status)
      -- an upstream error the worker receives as its fixed final answer (issue 26: 400,
      -- x-should-retry: false) is no failure of the call
      up:push { { json = { type = "error", error = { type = "rate_limit_error", message = "slow" } }, status = 429 } }
      assert.equal(400, h:model(body()).status)
      local l = last(h)
      assert.same({ "info", "broker call", 400, 429 }, { l.level, l.msg, l.fields.status, l.fields.upstream_status })
    end)
    -- the reflection also names itself on the logger's own line
    local named = false
    for _, l in ipairs(h.logs) do if l.msg == "model reply refused" and l.fields.reason == "reflection" then named = true end end
    assert.is_true(named)
  end)

  it("the worker transport and discovery write none; no line holds the token or the guest's text", function()
    h = harness.new { up = up }
    run(function()
      local w = peer.worker(h.sock, { turn = function() return { ok = true, text = "reply " .. GUEST, files = json.array() } end })
      harness.eventually(function() return h.b.ready end)
      assert.equal(200, h:get("/mcp-tools").status)
      assert.equal(200, h:get("/worker/config").status)
      local release = h:bind()
      local r = h.b:execute({ turnId = "t1", author = { id = "1", name = "A", principalId = "a" }, text = GUEST,
        memory = "", memoryVisibility = "private", images = {}, thinking = "low" })
      assert.is_true(r.ok)
      h:model(body(), { "Authorization: Bearer " .. SECRET, "Cookie: " .. GUEST })
      release()
      w.stop()
    end)
    assert.equal(1, #audits(h))
    local all = json.encode(json.jsonable(h.logs))
    assert.is_nil(all:find(SECRET, 1, true))
    assert.is_nil(all:find(GUEST, 1, true))
  end)

  it("the worker's own HEAD /anthropic preflight is answered 200 with no line, before and during a turn; other methods and paths there stay refusals", function()
    h = harness.new { up = up }
    run(function()
      local before = peer.request(h.sock, "HEAD", "/anthropic")
      assert.equal(200, before.status)
      assert.equal("", before.body or "")
      local release = h:bind { turnId = "t-pre" }
      assert.equal(200, peer.request(h.sock, "HEAD", "/anthropic").status)
      assert.equal(200, h:model(body()).status)
      assert.equal(1, #audits(h))
      assert.equal("broker call", audits(h)[1].msg)
      -- only that exact preflight: a GET, a query, a longer path are what they were
      assert.equal(404, peer.request(h.sock, "GET", "/anthropic").status)
      assert.equal("unknown_route", last(h).fields.reason)
      peer.request(h.sock, "HEAD", "/anthropic?x=1")
      assert.same({ 404, "query" }, { last(h).fields.status, last(h).fields.reason })
      peer.request(h.sock, "HEAD", "/anthropic/v1/files")
      assert.same({ 404, "unknown_route" }, { last(h).fields.status, last(h).fields.reason })
      release()
    end)
    assert.equal(4, #audits(h))   -- the model call and the three refusals above: no preflight line
  end)

  it("audit = false writes no audit line; the page's own lines stay", function()
    h = harness.new { up = up, over = { audit = false } }
    run(function()
      h:bind()
      assert.equal(200, h:model(body()).status)
      assert.equal(404, h:post("/tools/shell", { input = {} }).status)
      assert.equal(400, h:model({ messages = { { role = "developer", content = "x" } } }).status)
    end)
    assert.equal(0, #audits(h))
    assert.equal(1, #h:warns("sandbox upstream call failed"))
  end)
end)

describe("rich runtime: one logger (operations.md 2)", function()
  local dirs = {}
  teardown(function() spec_fs.rmdirs(dirs) end)

  local function base(over)
    local o = {
      partyDir = spec_fs.tmpdir("raud", dirs, spec_fs.short_tmp()) .. "/p", image = "pi-roundtable-sandbox:pi",
      profiles = { main = { model = "m" } }, oauthToken = function() return "k" end,
      effort = { judge = function() return "low" end }, driver = {},
    }
    for k, v in pairs(over or {}) do o[k] = v end
    return o
  end

  it("takes the operator log's options with their messages", function()
    assert.has_error(function() rich(base { logFormat = "xml" }) end, 'logFormat must be "text" or "json"')
    assert.has_error(function() rich(base { logLevel = "loud" }) end, 'logLevel must be "debug", "info", "warn" or "error"')
    assert.has_error(function() rich(base { audit = "no" }) end, "audit must be a boolean")
    assert.has_error(function() rich.broker { model = "m", oauthToken = function() end, audit = 1 } end, "audit must be a boolean")
  end)

  it("a runtime's broker writes its audit lines with the channel and the turn id", function()
    local fixture = require "rich_fixture_driver"
    local lines = {}
    local d = fixture.new { turn = function(_, _, w)
      local r = peer.request(w.sock, "POST", "/tools/clock", '{"input":{}}')
      return { ok = r.status == 200, text = "ok", error = r.status ~= 200 and "tool" or nil, files = json.array() }
    end }
    local rt = rich(base { driver = d, logger = harness.logger(lines), startTimeoutMs = 5000,
      tools = { names = { "clock" }, call = function() return { ok = true, text = "noon" } end } })
    local r
    run(function()
      r = rt:runTurn { channel = "discord:party", profile = "main", turnId = "t-42",
        author = { id = "1", name = "Ann" }, text = "hi", images = {} }
      rt:stopBrokers()
    end)
    d.close()
    run(function() async.sleep(60) end)
    assert.is_true(r.ok, r.error)
    local calls = {}
    for _, l in ipairs(lines) do if l.msg == "broker call" then calls[#calls + 1] = l.fields end end
    assert.equal(1, #calls)
    assert.same({ "discord:party", "t-42", "/tools/clock", 200 }, { calls[1].channel, calls[1].turn, calls[1].route, calls[1].status })
  end)

  it("logLevel filters the operator's logger: warn keeps the warnings, drops the info lines", function()
    local lines = {}
    local rt = rich(base { logLevel = "warn", logger = harness.logger(lines) })
    rt.log.info("Sandbox conversation archived", { channel = "c", archived = 1 })
    rt.log.warn("sandbox worker log unavailable", { channel = "c", turnId = "t", error = "e" })
    assert.equal(1, #lines)
    assert.same({ "warn", "sandbox worker log unavailable" }, { lines[1].level, lines[1].msg })
    assert.is_table(rt.log.logger)
    assert.is_true(rt.log.logger:enabled("warn"))
    assert.is_false(rt.log.logger:enabled("info"))
  end)
end)
