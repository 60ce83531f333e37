-- rich/reasons_spec.lua: a rich turn is one turn record like a sealed one
-- (spec/operations.md 3-4, issue 21 item 6): a turn that fails names its
-- reason and fix in a `turn finished` line, and every turn counts in
-- sbx_turns_total{mode="rich",reason} and the broker families of the same
-- registry. The real rich runtime and broker on the channel's real socket;
-- the worker a rich_peer behind the offline fixture driver; the model
-- upstream the Anthropic-shaped loopback fixture.
local async = require "sandbox.async"
local fixture = require "rich_fixture_driver"
local harness = require "rich_harness"
local json = require "sandbox.json"
local P = require "prom"
local peer = require "rich_peer"
local rich = require "sandbox.rich"
local spec_fs = require "spec_fs"
local upstream = require "anthropic_upstream"

local dirs, drivers = {}, {}
teardown(function() spec_fs.rmdirs(dirs) end)
after_each(function()
  for _, d in ipairs(drivers) do d.close() end
  drivers = {}
  async.run(function() async.sleep(60) end)
end)

local AUTHOR = { id = "123", name = "Ann", principalId = "ann" }

local function runtime(over, driver_opts, up)
  local logs = {}
  local d = fixture.new(driver_opts)
  drivers[#drivers + 1] = d
  local o = {
    partyDir = spec_fs.tmpdir("rrs", dirs, spec_fs.short_tmp()) .. "/p", image = "pi-roundtable-sandbox:pi",
    profiles = { main = { model = "claude-sonnet-4-6" } },
    oauthToken = function() return harness.SECRET end,
    effort = { judge = function() return "low" end },
    driver = d, logger = harness.logger(logs), startTimeoutMs = 5000,
  }
  if up then o.fetchImpl = harness.forward(up, {}) end
  for k, v in pairs(over or {}) do o[k] = v end
  return rich(o), d, logs
end

local function turn(id)
  return { channel = "discord:party", profile = "main", turnId = id, author = AUTHOR, text = "hello", images = {} }
end

local function finished(logs)
  local out = {}
  for _, l in ipairs(logs) do if l.msg == "turn finished" then out[#out + 1] = l end end
  return out
end

describe("rich turns: one record, one reason, one registry (operations.md 3-4)", function()
  local up
  setup(function() up = upstream.start() end)
  teardown(function() up:stop() end)
  before_each(function() async.run(function() up:reset() end) end)

  it("an ok turn is an info `turn finished` line with turn and reason=ok, counted with mode=rich", function()
    local rt, _, logs = runtime({}, { turn = function() return { ok = true, text = "done", files = json.array() } end })
    local during
    async.run(function()
      assert.is_true(rt:runTurn(turn("t-ok")).ok)
      during = rt:metrics()
      rt:stopBrokers()
    end)
    -- the channel's long-lived container counts as running while its broker lives
    assert.equal(1, P.value(during, 'sbx_containers{state="running"}'))
    assert.equal(0, P.value(rt:metrics(), 'sbx_containers{state="running"}'))
    local f = finished(logs)
    assert.equal(1, #f)
    assert.equal("info", f[1].level)
    assert.same({ "discord:party", "t-ok", "ok" }, { f[1].fields.channel, f[1].fields.turn, f[1].fields.reason })
    local text = rt:metrics()
    assert.equal(1, P.value(text, 'sbx_turns_total{mode="rich",reason="ok"}'))
    assert.equal(0, P.value(text, 'sbx_turns_total{mode="rich",reason="worker_failed"}'))
    assert.equal(1, P.value(text, 'sbx_turn_duration_seconds_count{mode="rich"}'))
  end)

  it("a worker that failed is reason=worker_failed with its fix, at warn, and counts", function()
    local rt, _, logs = runtime({}, { turn = function() return { ok = false, error = "prompt failed: nope" } end })
    async.run(function() assert.is_false(rt:runTurn(turn("t-bad")).ok) rt:stopBrokers() end)
    local f = finished(logs)[1]
    assert.equal("warn", f.level)
    assert.equal("worker_failed", f.fields.reason)
    assert.equal("t-bad", f.fields.turn)
    assert.matches("docker logs", f.fields.fix, 1, true)
    assert.is_nil(tostring(f.fields.fix):find("nope", 1, true))   -- never the worker's own text
    assert.equal(1, P.value(rt:metrics(), 'sbx_turns_total{mode="rich",reason="worker_failed"}'))
  end)

  it("a daemon the built-in driver cannot reach is daemon_unavailable with its fix", function()
    local dir = spec_fs.tmpdir("rrn", dirs, spec_fs.short_tmp())
    local logs = {}
    local rt = rich {
      partyDir = dir .. "/p", image = "pi-roundtable-sandbox:pi", profiles = { main = { model = "claude-sonnet-4-6" } },
      oauthToken = function() return harness.SECRET end, effort = { judge = function() return "low" end },
      driver = rich.dockerDriver { socket = dir .. "/no-daemon.sock" }, logger = harness.logger(logs), startTimeoutMs = 2000,
    }
    async.run(function() assert.is_false(rt:runTurn(turn("t-nod")).ok) rt:stopBrokers() end)
    local f = finished(logs)[1]
    assert.equal("daemon_unavailable", f.fields.reason)
    assert.truthy(f.fields.fix)
    assert.equal(1, P.value(rt:metrics(), 'sbx_turns_total{mode="rich",reason="daemon_unavailable"}'))
  end)

  it("a timed-out turn is reason=deadline with the turnTimeoutMs fix", function()
    local rt, _, logs = runtime({ turnTimeoutMs = 1000 }, { turn = function()
      async.sleep(3000)
      return { ok = true, text = "late", files = json.array() }
    end })
    async.run(function() rt:runTurn(turn("t-slow")) rt:stopBrokers() end)
    local f = finished(logs)[1]
    assert.equal("deadline", f.fields.reason)
    assert.matches("turnTimeoutMs", f.fields.fix, 1, true)
    assert.equal(1, P.value(rt:metrics(), 'sbx_turns_total{mode="rich",reason="deadline"}'))
  end)

  it("a worker that failed on the provider's 401 is upstream_status with its status and fix; the call counts in the broker families", function()
    local rt, _, logs = runtime({}, { turn = function(_, _, w)
      local r = peer.request(w.sock, "POST", "/anthropic/v1/messages",
        json.encode(json.jsonable { messages = { { role = "user", content = "hi" } } }))
      -- issue 26: the fixed final answer, never the provider's text
      assert(r.status == 400 and r.headers["x-should-retry"] == "false", "the worker sees the fixed final answer")
      assert(r.body == '{"type":"error","error":{"type":"authentication_error","message":"Upstream error"}}', r.body)
      return { ok = false, error = "model call failed" }
    end }, up)
    async.run(function()
      up:push { { json = { type = "error", error = { type = "authentication_error", message = "OAuth token has expired" } }, status = 401 } }
      assert.is_false(rt:runTurn(turn("t-401")).ok)
      rt:stopBrokers()
    end)
    local f = finished(logs)[1]
    assert.same({ "upstream_status", 401, 1 }, { f.fields.reason, f.fields.status, f.fields.model_calls })
    assert.matches("refresh the host's login", f.fields.fix, 1, true)
    local text = rt:metrics()
    assert.equal(1, P.value(text, 'sbx_turns_total{mode="rich",reason="upstream_status"}'))
    assert.equal(1, P.value(text, 'sbx_upstream_responses_total{route_kind="model",status="401"}'))
    assert.equal(1, P.value(text, 'sbx_broker_requests_total{route_kind="model",status="400"}'))
    for reason in pairs(require("sandbox.ops.lines").REFUSALS) do   -- a healthy call is no refusal
      assert.equal(0, P.value(text, 'sbx_broker_refusals_total{reason="' .. reason .. '"}'), reason)
    end
  end)
end)
