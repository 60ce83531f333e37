-- docker/prometheus_spec.lua: a real Prometheus server scrapes the
-- engine's metricsListen and reads back what real sealed turns moved
-- (spec/operations.md 4, "Behaviours the specs must cover" 5). The turns
-- run in real Docker containers of the worker image (the default docker
-- CLI driver) as the non-root service account, against a loopback model
-- server; Debian's `prometheus` (installed by `make deps`) runs on a free
-- loopback port with a temporary storage directory and a scrape config
-- pointing at metricsListen, and the spec asks its HTTP query API
-- (/api/v1/query) for sbx_turns_total. A scrape of metricsListen in the
-- middle of a turn shows that turn's container running. Every wait is
-- bounded; the Prometheus process, its directory, the turns' containers
-- and the runtime are cleaned up. Opt-in with SANDBOX_DOCKER_TEST=1.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local sandbox = require "sandbox"
local spec_fs = require "spec_fs"
local P = require "prom"

local ENABLED = os.getenv("SANDBOX_DOCKER_TEST") == "1"
local KEY = "prometheus-spec-key-8Rt"
local SPEAKER = { id = "guest", name = "Guest", principalId = "p_guest" }

local function sh(cmd) return spec_fs.run(cmd .. " 2>&1") end

if not ENABLED then
  describe("a real Prometheus scrape of real turns", function()
    pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker specs (make check does)")
  end)
  return
end

if not P.have(P.PROMETHEUS) then
  describe("a real Prometheus scrape of real turns", function()
    pending("prometheus is not installed: `make deps` (as root) installs Debian's prometheus package")
  end)
  return
end

describe("a real Prometheus scrape of real turns", function()
  local root, server, rt, prom
  local hold, held = false, nil
  local refuse_next = false

  setup(function()
    assert.is_not.equal(0, (core.getuid()), "run the Docker specs as the non-root sbx account")
    local _, rc = sh("docker image inspect pi-roundtable-sandbox:local")
    assert.equal(0, rc, "make image first")
    root = spec_fs.tmpdir("sb-prom")
    -- the model: answers every call with text; holds one call when asked,
    -- so the spec can scrape in the middle of a turn; refuses one with 401
    server = assert(core.http_server {
      on_request = function(req)
        if req.headers.authorization ~= "Bearer " .. KEY then return req:reply(401, "{}") end
        if refuse_next then
          refuse_next = false
          return req:reply(401, '{"error":{"code":"invalid_api_key","message":"no"}}')
        end
        local answer = json.encode { choices = json.array { { index = 0,
          message = { role = "assistant", content = "scraped" }, finish_reason = "stop" } } }
        if hold then
          hold = false
          held = function() req:reply(200, answer) end
          return
        end
        req:reply(200, answer)
      end,
    })
    rt = sandbox.runtime {
      image = "pi-roundtable-sandbox:local", runRoot = root .. "/run", workspaceRoot = root .. "/work",
      model = "fake-model", modelUrl = server:url("/v1/chat/completions"), allowHttp = true,
      apiKey = function() return KEY end, metricsListen = "127.0.0.1:0", logLevel = "error",
      runtime = require("docker_runtime").name,
    }
    os.execute("mkdir -m 700 " .. spec_fs.q(root .. "/prom"))
    prom = async.run(function()
      return P.prometheus { target = assert(rt:metrics_address()), dir = root .. "/prom",
        rules = core.realpath("examples/prometheus/sbx-alerts.yml") }
    end)
  end)

  teardown(function()
    if prom then async.run(function() prom:stop() end) end
    if rt then
      local inst = rt.installation
      async.run(function() rt:dispose() end)
      if inst then
        assert.equal("", sh("docker ps -aq --filter label=roundtable.sandbox.installation=" .. inst))
      end
    end
    if server then server:close() end
    if root then spec_fs.rmdir(root, "sb-prom") end
  end)

  local function turn(channel, text)
    return async.run(function() return rt:run_turn(channel, SPEAKER, text) end)
  end

  it("a scrape of metricsListen during a turn shows its container running and the counters so far", function()
    local first = turn("fake:prom-a", "hello")
    assert.is_true(first.ok, first.reason)
    hold = true
    local during, after = async.run(function()
      local task = async.spawn(function() return rt:run_turn("fake:prom-b", SPEAKER, "hello again") end)
      local deadline = core.now() + 60000
      while held == nil and core.now() < deadline and not task.done do async.sleep(50) end
      assert(held, "the turn's model call never arrived")
      local d = P.get("http://" .. rt:metrics_address() .. "/metrics")
      held()
      local _, r = async.wait(task)
      return d, r
    end)
    assert.is_true(after.ok, after.reason)
    assert.equal(200, during.status)
    assert.equal(1, P.value(during.body, 'sbx_containers{state="running"}'))
    assert.equal(1, P.value(during.body, 'sbx_turns_total{reason="ok"}'))
    assert.equal(1, P.value(during.body, 'sbx_broker_requests_total{route_kind="model",status="200"}'))
    local now = rt:metrics()
    assert.equal(0, P.value(now, 'sbx_containers{state="running"}'))
    assert.equal(2, P.value(now, 'sbx_turns_total{reason="ok"}'))
    assert.equal(2, P.value(now, 'sbx_turn_phase_seconds_count{phase="removed"}'))
  end)

  it("Prometheus scrapes metricsListen and answers sbx_turns_total through /api/v1/query", function()
    refuse_next = true
    local failed = turn("fake:prom-c", "hello")
    assert.equal("upstream_status", failed.reason)
    local function sample(q)
      return function(doc)
        local r = doc.status == "success" and doc.data.result[1]
        return r and r.value and r.value[2] == q
      end
    end
    local ok, health = async.run(function()
      local answer = prom:wait_for('sbx_turns_total{job="sbx",reason="ok"}', sample("2"), "two ok turns")
      prom:wait_for('sbx_turns_total{job="sbx",reason="upstream_status"}', sample("1"), "one upstream_status turn")
      prom:wait_for('up{job="sbx"}', sample("1"), "the target up")
      local all = prom:query("sbx_turns_total")
      return { answer = answer, all = all }, prom:target_health()
    end)
    assert.equal("up", health)
    -- the shipped alert rules load and evaluate against the real scrape
    local groups = async.run(function()
      local deadline = core.now() + 30000
      while core.now() < deadline do
        local g = prom:rules()
        local rules = g and g.data and g.data.groups and g.data.groups[1] and g.data.groups[1].rules
        if rules and #rules == 7 and rules[1].lastEvaluation ~= "0001-01-01T00:00:00Z" then return g end
        async.sleep(500)
      end
      return prom:rules()
    end)
    local loaded = groups.data.groups[1]
    assert.equal("pi-roundtable-sandbox", loaded.name)
    assert.equal(7, #loaded.rules)
    for _, rule in ipairs(loaded.rules) do assert.equal("ok", rule.health, rule.name .. ": " .. tostring(rule.lastError)) end
    local r = ok.answer.data.result[1]
    assert.equal("sbx_turns_total", r.metric.__name__)
    assert.equal("ok", r.metric.reason)
    assert.equal(rt:metrics_address(), r.metric.instance)
    -- every reason of the closed set is a series, none carries a channel or a speaker
    local reasons = {}
    for _, s in ipairs(ok.all.data.result) do
      reasons[s.metric.reason] = s.value[2]
      for k, val in pairs(s.metric) do
        assert.is_nil(tostring(val):find("fake:prom", 1, true), k)
        assert.is_nil(tostring(val):find(SPEAKER.principalId, 1, true), k)
      end
    end
    assert.equal(#require("sandbox.ops.metrics").reasons_of("sealed"),
      (function() local n = 0 for _ in pairs(reasons) do n = n + 1 end return n end)())
    assert.equal("0", reasons.worker_oom)
    -- what an operator would note: the scraped answer
    io.stderr:write("prometheus query sbx_turns_total{reason=\"ok\"}: ", json.encode(ok.answer), "\n")
  end)
end)
