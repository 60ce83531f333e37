-- metrics_spec.lua: the Prometheus metrics of spec/operations.md 4
-- ("Behaviours the specs must cover" 5), without a container:
--   * the text exposition of ops/exposition.lua (format 0.0.4: HELP/TYPE,
--     escaping, cumulative histogram buckets up to le="+Inf", _sum, _count)
--     and its bounded labels;
--   * every metric moving on real turns: the real runtime, the real broker
--     on the turn's socket, the real worker Lua (worker_harness.lua's
--     driver) or a driver over the real driver contract, a real loopback
--     upstream, and real hostile requests on the broker socket;
--   * metricsListen: refused unless loopback, served on the engine's own
--     loop over real loopback HTTP (curl), GET /metrics only;
--   * `promtool check metrics` (Debian's prometheus package) on the
--     exposition real turns produced.
-- The real Prometheus server scraping real Docker turns is
-- spec/docker/prometheus_spec.lua.
local async = require "sandbox.async"
local contract = require "sandbox.drivers.contract"
local core = require "sandbox.core"
local exposition = require "sandbox.ops.exposition"
local json = require "sandbox.json"
local sandbox = require "sandbox"
local fake = require "fake_driver"
local fake_upstream = require "fake_upstream"
local spec_fs = require "spec_fs"
local P = require "prom"
local W = require "worker_harness"

local LOOPBACK = "metricsListen must be a loopback address and port"
local KEY = "sk-metrics-planted-4Zq"
local SPEAKER = { id = "guest-7781", name = "Guest", principalId = "p_guest_7781" }
local CHANNEL = "fake:metrics-chan-5521"

local roots = {}
teardown(function() spec_fs.rmdirs(roots) end)

local up
setup(function() up = fake_upstream.start() end)
teardown(function() if up then up:stop() end end)

local function script(list) async.run(function() up:reset() up:script(list) end) end

local function reply(message, finish)
  return { status = 200, body = json.encode(json.object({ "choices" }, { choices = json.array {
    json.object({ "index", "message", "finish_reason" }, { index = 0, message = message, finish_reason = finish or "stop" }) } })) }
end

local function text_reply(t) return reply(json.object({ "role", "content" }, { role = "assistant", content = t })) end

local function call_tool(name)
  return reply(json.object({ "role", "content", "tool_calls" }, { role = "assistant", content = json.null,
    tool_calls = json.array { json.object({ "id", "type", "function" }, { id = "c1", type = "function",
      ["function"] = json.object({ "name", "arguments" }, { name = name, arguments = "{}" }) }) } }), "tool_calls")
end

local function options(root, over)
  local o = {
    image = "pi-roundtable-sandbox:local", runRoot = root .. "/run", workspaceRoot = root .. "/work",
    model = "spec-model", modelUrl = up:url("/v1/chat/completions"), allowHttp = true,
    apiKey = function() return KEY end, logLevel = "error",
    tools = { { name = "secret_tool_name", description = "s", parameters = { type = "object" },
      run = function() return "TOOL-RESULT-77" end } },
  }
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

local health = require "sandbox.ops.health"

local function runtime(over)
  local root = spec_fs.tmpdir("mt", roots, spec_fs.short_tmp())
  return sandbox.runtime(options(root, over)), root
end

local function turn(rt, text, channel)
  return async.run(function() return rt:run_turn(channel or CHANNEL, SPEAKER, text or "What time is it?") end)
end

local function dispose(rt) async.run(function() rt:dispose() end) end

local function v(rt, series) return P.value(rt:metrics(), series) end

-- Each {series, value} of want is a sample of text with that value.
local function expect_samples(text, want)
  for _, w in ipairs(want) do
    assert.equal(w[2], P.value(text, w[1]), w[1] .. "\n" .. text)
  end
end

-- A driver over the real contract (drivers/contract.lua) whose primitives
-- play a container: stdout is `stdout`; gates.read / gates.remove, when
-- set, hold that step until the spec opens them; removal answers `removal`.
local function contract_driver(o)
  o = o or {}
  local d = { remove_timeout_ms = 5000 }
  local function hold(name)
    if not (o.gates and o.gates[name]) then return end
    async.await(function(resume) o.gates[name] = resume end)
  end
  function d:create() return {} end
  function d:start() end
  function d:read()
    hold("read")
    return o.stdout or '{"ok":true,"text":"done"}', false
  end
  function d:wait() return 0 end
  function d:release() end
  function d:remove_once()
    hold("remove")
    return o.removal or "ok"
  end
  function d:list_once() return o.list or {} end
  return contract.methods(d)
end

describe("the text exposition (format 0.0.4)", function()
  it("writes HELP and TYPE per family, then its samples", function()
    local reg = exposition.registry()
    local c = reg:counter("spec_things_total", "Things.", { kind = { a = true, b = true } })
    c:inc { kind = "b" }
    c:inc({ kind = "a" }, 2)
    reg:gauge("spec_level", "A level."):set(nil, 1.5)
    assert.equal(table.concat({
      "# HELP spec_things_total Things.",
      "# TYPE spec_things_total counter",
      'spec_things_total{kind="a"} 2',
      'spec_things_total{kind="b"} 1',
      "# HELP spec_level A level.",
      "# TYPE spec_level gauge",
      "spec_level 1.5",
      "",
    }, "\n"), reg:render())
  end)

  it("writes a histogram as cumulative buckets ending at le=\"+Inf\", then _sum and _count", function()
    local reg = exposition.registry()
    local h = reg:histogram("spec_seconds", "Time.", { route_kind = { model = true } }, { 0.5, 1, 2.5 })
    for _, x in ipairs { 0.2, 0.7, 0.9, 3 } do h:observe({ route_kind = "model" }, x) end
    local text = reg:render()
    expect_samples(text, {
      { 'spec_seconds_bucket{route_kind="model",le="0.5"}', 1 },
      { 'spec_seconds_bucket{route_kind="model",le="1"}', 3 },
      { 'spec_seconds_bucket{route_kind="model",le="2.5"}', 3 },
      { 'spec_seconds_bucket{route_kind="model",le="+Inf"}', 4 },
      { 'spec_seconds_sum{route_kind="model"}', 4.8 },
      { 'spec_seconds_count{route_kind="model"}', 4 },
    })
    assert.truthy(text:find("# TYPE spec_seconds histogram\n", 1, true))
  end)

  it("escapes label values (backslash, double quote, newline) and help text (backslash, newline)", function()
    local reg = exposition.registry()
    local any = function(s) return s end       -- a spec-only open set, to see the escaping
    reg:counter("spec_esc_total", "a \\ help\nline", { v = any }):inc { v = 'a\\b"c\nd' }
    local text = reg:render()
    assert.truthy(text:find("# HELP spec_esc_total a \\\\ help\\nline\n", 1, true))
    assert.truthy(text:find('spec_esc_total{v="a\\\\b\\"c\\nd"} 1\n', 1, true))
  end)

  it("spells numbers as the format does: integers, shortest floats, +Inf, -Inf, NaN", function()
    assert.equal("3", exposition.number(3))
    assert.equal("3", exposition.number(3.0))
    assert.equal("0.1", exposition.number(0.1))
    assert.equal("0.30000000000000004", exposition.number(0.1 + 0.2))
    assert.equal("+Inf", exposition.number(math.huge))
    assert.equal("-Inf", exposition.number(-math.huge))
    assert.equal("NaN", exposition.number(0 / 0))
  end)

  it("drops an observation whose label value is outside the family's closed set", function()
    local reg = exposition.registry()
    local c = reg:counter("spec_r_total", "R.", { reason = { ok = true } })
    c:inc { reason = "ok" }
    c:inc { reason = "guest text " .. KEY }
    c:inc { reason = 5 }
    c:inc(nil)
    local text = reg:render()
    assert.equal(1, P.value(text, 'spec_r_total{reason="ok"}'))
    assert.is_nil(text:find(KEY, 1, true))
    assert.equal(1, select(2, text:gsub("\nspec_r_total", "")))
  end)

  it("bounds the series of one family (MAX_SERIES)", function()
    local reg = exposition.registry()
    local c = reg:counter("spec_many_total", "Many.", { n = function(x) return tostring(x) end })
    for i = 1, exposition.MAX_SERIES + 50 do c:inc { n = i } end
    local _, lines = reg:render():gsub("\nspec_many_total{", "")
    assert.equal(exposition.MAX_SERIES, lines)
  end)

  it("refuses a family without help, a label without its set, a bad or repeated name", function()
    local reg = exposition.registry()
    assert.has_error(function() reg:counter("x_total", "") end)
    assert.has_error(function() reg:counter("x_total", "X.", { reason = true }) end)
    assert.has_error(function() reg:counter("0bad", "X.") end)
    assert.has_error(function() reg:histogram("h", "H.", nil, { 2, 1 }) end)
    reg:counter("x_total", "X.")
    assert.has_error(function() reg:counter("x_total", "X.") end)
  end)
end)

describe("the engine's metrics on real turns", function()
  it("counts the host's retries of a call (tries beyond the first) in sbx_upstream_retries_total", function()
    local m = require("sandbox.ops.metrics").new()
    local read = m:reader()
    read { kind = "call", route_kind = "model", status = 200, upstream_status = 200, tries = 3 }
    read { kind = "call", route_kind = "model", status = 200, upstream_status = 200, tries = 1 }
    assert.equal(2, P.value(m:render(), 'sbx_upstream_retries_total{route_kind="model"}'))
  end)

  it("an empty runtime exposes every family, the closed reasons and container states at 0", function()
    if not spec_fs.service_account(pending) then return end
    local rt = runtime { driver = fake.new(fake.reply(true, "x")) }
    local text = rt:metrics()
    dispose(rt)
    for _, fam in ipairs { "sbx_turns_total counter", "sbx_turn_duration_seconds histogram",
        "sbx_turn_phase_seconds histogram", "sbx_broker_requests_total counter",
        "sbx_broker_refusals_total counter", "sbx_upstream_responses_total counter",
        "sbx_upstream_duration_seconds histogram", "sbx_reflection_refusals_total counter",
        "sbx_containers gauge", "sbx_channel_queue_depth gauge", "sbx_cleanup_failures_total counter" } do
      assert.truthy(text:find("\n# TYPE " .. fam .. "\n", 1, true) or text:find("^# TYPE " .. fam .. "\n"), fam)
    end
    for _, r in ipairs(require("sandbox.ops.metrics").reasons_of("sealed")) do
      assert.equal(0, P.value(text, 'sbx_turns_total{reason="' .. r .. '"}'), r)
    end
    for _, s in ipairs { "running", "warm", "removing" } do
      assert.equal(0, P.value(text, 'sbx_containers{state="' .. s .. '"}'), s)
    end
    expect_samples(text, {
      { 'sbx_broker_refusals_total{reason="unknown_route"}', 0 },
      { "sbx_channel_queue_depth", 0 },
      { "sbx_reflection_refusals_total", 0 },
      { "sbx_turn_duration_seconds_count", 0 },
    })
  end)

  it("an ok turn with a tool call: turns, broker requests by route kind, upstream responses and times", function()
    if not W.available() then return pending("build/worker/sbxw.so is not built (make)") end
    if not spec_fs.service_account(pending) then return end
    script { call_tool("host_secret_tool_name"), text_reply("It is noon.") }
    local rt = runtime { driver = W.driver() }
    local r = turn(rt)
    assert.is_true(r.ok, r.reason)
    local text = rt:metrics()
    dispose(rt)
    expect_samples(text, {
      { 'sbx_turns_total{reason="ok"}', 1 },
      { 'sbx_broker_requests_total{route_kind="model",status="200"}', 2 },
      { 'sbx_broker_requests_total{route_kind="tools",status="200"}', 1 },
      { 'sbx_upstream_responses_total{route_kind="model",status="200"}', 2 },
      { 'sbx_upstream_duration_seconds_count{route_kind="model"}', 2 },
      { 'sbx_upstream_duration_seconds_bucket{route_kind="model",le="+Inf"}', 2 },
      { "sbx_turn_duration_seconds_count", 1 },
      { 'sbx_turn_phase_seconds_count{phase="first_call"}', 1 },
    })
    -- nothing of the turn's own data is a label or a value
    for _, secret in ipairs { KEY, CHANNEL, SPEAKER.id, SPEAKER.principalId, "secret_tool_name", "TOOL-RESULT-77",
        "What time", "/v1/chat", "127.0.0.1" } do
      assert.is_nil(text:find(secret, 1, true), secret)
    end
  end)

  it("model tokens: each call's reported usage in sbx_model_tokens_total, the call and turn lines", function()
    if not W.available() then return pending("build/worker/sbxw.so is not built (make)") end
    if not spec_fs.service_account(pending) then return end
    local function with_usage(r, usage)
      local v = json.decode(r.body)
      local names = json.keys(v)
      names[#names + 1] = "usage"
      v.usage = json.decode(usage)
      r.body = json.encode(json.object(names, v))
      return r
    end
    -- OpenAI's shape with details, then DeepSeek's cache-hit member, then none at all
    script {
      with_usage(call_tool("host_secret_tool_name"), '{"prompt_tokens":120,"completion_tokens":15,"total_tokens":135,'
        .. '"prompt_tokens_details":{"cached_tokens":100},"completion_tokens_details":{"reasoning_tokens":7}}'),
      with_usage(text_reply("It is noon."), '{"prompt_tokens":140,"completion_tokens":4,"prompt_cache_hit_tokens":128}'),
    }
    local lines = {}
    local function keep(level) return function(msg, f) lines[#lines + 1] = { level = level, msg = msg, f = f } end end
    local rt = runtime { driver = W.driver(), logLevel = "debug",
      logger = { debug = keep "debug", info = keep "info", warn = keep "warn", error = keep "error" } }
    local r = turn(rt)
    assert.is_true(r.ok, r.reason)
    script { text_reply("Bare.") }
    assert.is_true(turn(rt).ok)
    local text = rt:metrics()
    dispose(rt)
    expect_samples(text, {
      { 'sbx_model_tokens_total{direction="input"}', 260 },
      { 'sbx_model_tokens_total{direction="output"}', 19 },
      { 'sbx_model_tokens_total{direction="cached"}', 228 },
      { 'sbx_model_tokens_total{direction="reasoning"}', 7 },
    })
    local finished = {}
    for _, l in ipairs(lines) do if l.msg == "turn finished" then finished[#finished + 1] = l.f end end
    assert.equal(2, #finished)
    assert.equal(260, finished[1].tokens_in)
    assert.equal(19, finished[1].tokens_out)
    assert.equal(228, finished[1].tokens_cached)
    assert.equal(7, finished[1].tokens_reasoning)
    assert.equal(0, finished[2].tokens_in)
    assert.is_nil(finished[2].tokens_cached)
  end)

  it("failed turns count under their reason; the provider's status and a reflected key are counted", function()
    if not W.available() then return pending("build/worker/sbxw.so is not built (make)") end
    if not spec_fs.service_account(pending) then return end
    local rt = runtime { driver = W.driver() }
    script { { status = 401, body = '{"error":{"code":"invalid_api_key","message":"no"}}' } }
    assert.equal("upstream_status", turn(rt).reason)
    script { text_reply("the key is " .. KEY) }
    assert.equal("reflection", turn(rt).reason)
    local text = rt:metrics()
    dispose(rt)
    expect_samples(text, {
      { 'sbx_turns_total{reason="upstream_status"}', 1 },
      { 'sbx_turns_total{reason="reflection"}', 1 },
      { 'sbx_turns_total{reason="ok"}', 0 },
      { 'sbx_upstream_responses_total{route_kind="model",status="401"}', 1 },
      { 'sbx_upstream_responses_total{route_kind="model",status="200"}', 1 },
      { 'sbx_broker_requests_total{route_kind="model",status="502"}', 2 },
      { "sbx_reflection_refusals_total", 1 },
      { "sbx_turn_duration_seconds_count", 2 },
    })
    assert.is_nil(text:find(KEY, 1, true))
  end)

  it("a hostile request's refusal counts under its reason, an unknown target as route kind other", function()
    if not spec_fs.service_account(pending) then return end
    local rt = runtime { driver = fake.new(function(spec)
      local r1 = fake.post(spec, "/tools/not-configured-" .. KEY, "{}")
      local r2 = fake.post(spec, "/model?x=1", "{}")
      return { ok = true, text = r1.status .. " " .. r2.status }
    end) }
    local r = turn(rt)
    assert.is_true(r.ok)
    local text = rt:metrics()
    dispose(rt)
    expect_samples(text, {
      { 'sbx_broker_refusals_total{reason="unknown_route"}', 1 },
      { 'sbx_broker_refusals_total{reason="query"}', 1 },
      { 'sbx_broker_requests_total{route_kind="other",status="404"}', 2 },
    })
    assert.is_nil(text:find("not-configured", 1, true))
  end)

  it("phase histograms come from the turn record the `turn finished` line is written from", function()
    if not spec_fs.service_account(pending) then return end
    local lines = {}
    local logger = {}
    for _, l in ipairs { "debug", "info", "warn", "error" } do
      logger[l] = function(m, f) if m == "turn finished" then lines[#lines + 1] = f end end
    end
    local rt = runtime { driver = contract_driver(), logger = logger, logLevel = "info" }
    assert.is_true(turn(rt).ok)
    local text = rt:metrics()
    dispose(rt)
    local f = assert(lines[1])
    for phase, field in pairs { start = "ms_start", reply = "ms_reply", removed = "ms_removed" } do
      assert.equal(1, P.value(text, 'sbx_turn_phase_seconds_count{phase="' .. phase .. '"}'), phase)
      assert.equal(f[field] / 1000, P.value(text, 'sbx_turn_phase_seconds_sum{phase="' .. phase .. '"}'), phase)
    end
    assert.equal(f.ms / 1000, P.value(text, "sbx_turn_duration_seconds_sum"))
    -- no broker call: no first_call phase, in the line or the histogram
    assert.is_nil(f.ms_first_call)
    assert.is_nil(P.value(text, 'sbx_turn_phase_seconds_count{phase="first_call"}'))
  end)

  it("sbx_containers shows a turn's container running, then removing, then none", function()
    if not spec_fs.service_account(pending) then return end
    local gates = { read = true, remove = true }
    local rt = runtime { driver = contract_driver { gates = gates } }
    local seen = {}
    local function states()
      local t = rt:metrics()
      return { P.value(t, 'sbx_containers{state="running"}'), P.value(t, 'sbx_containers{state="removing"}') }
    end
    async.run(function()
      local task = async.spawn(function() return rt:run_turn(CHANNEL, SPEAKER, "hi") end)
      spec_fs.wait_for(function() return type(gates.read) == "function" end, "the read step")
      seen[1] = states()
      gates.read()
      spec_fs.wait_for(function() return type(gates.remove) == "function" end, "the removal step")
      seen[2] = states()
      gates.remove()
      async.wait(task)
      seen[3] = states()
    end)
    dispose(rt)
    assert.same({ { 1, 0 }, { 0, 1 }, { 0, 0 } }, seen)
  end)

  it("sbx_channel_queue_depth counts the app's turns waiting behind a channel's running one", function()
    if not spec_fs.service_account(pending) then return end
    local root = spec_fs.tmpdir("mq", roots, spec_fs.short_tmp())
    local release
    local o = options(root, { stateFile = root .. "/state/channels.json", initialChannels = { "discord:5" },
      driver = fake.new(function()
        async.await(function(resume) release = resume end)
        return { ok = true, text = "done" }
      end) })
    o.apiKey = nil
    o.tools = nil
    local app = sandbox(o)
    local depth = {}
    async.run(function()
      app:start { hostLogin = function() return KEY end }
      local event = { type = "message", channelId = "5", guildId = "9", author = { id = "a", name = "A" },
        mentionsBot = true, text = "hi" }
      local tasks = {}
      for i = 1, 3 do tasks[i] = async.spawn(function() return app:handle(event, { tier = "member", principalId = "p_a" }) end) end
      spec_fs.wait_for(function() return release ~= nil end, "the first turn")
      depth[1] = P.value(app:metrics(), "sbx_channel_queue_depth")
      for i = 1, 3 do
        spec_fs.wait_for(function() return release ~= nil end, "turn " .. i)
        local r = release
        release = nil
        r()
        async.wait(tasks[i])
      end
      depth[2] = P.value(app:metrics(), "sbx_channel_queue_depth")
      app:dispose()
    end)
    assert.same({ 2, 0 }, depth)
  end)

  it("sbx_cleanup_failures_total counts a turn's failed removal and a failed stale sweep", function()
    if not spec_fs.service_account(pending) then return end
    local rt = runtime { driver = contract_driver { removal = "fail" } }
    assert.equal("cleanup_failed", turn(rt).reason)
    local n = v(rt, "sbx_cleanup_failures_total")
    dispose(rt)
    assert.equal(1, n)
    local d = contract_driver()
    function d:list_once() return nil end              -- the daemon does not list
    local quiet = { info = function() end, warn = function() end, error = function() end }
    rt = runtime { driver = d, logger = quiet }
    async.run(function() pcall(rt.sweep, rt) end)
    n = v(rt, "sbx_cleanup_failures_total")
    dispose(rt)
    assert.is_true(n >= 1, tostring(n))
  end)

  it("app:metrics() raises `sandbox is not started` before start", function()
    local app = sandbox(options("/tmp/never-created-root"))
    assert.has_error(function() app:metrics() end, "sandbox is not started")
  end)
end)

describe("metricsListen (loopback only)", function()
  local bad = { "0.0.0.0:9464", "10.1.2.3:9464", "192.168.0.1:80", "localhost:9464", "127.0.0.1",
    ":9464", "[::]:9464", "::1:9464", "[::ffff:127.0.0.1]:9464", "127.0.0.1:65536", "127.0.0.1:-1",
    "127.0.0.1:9464 ", " 127.0.0.1:9464", "127.000.0.1:9464", "127.0.0.1:94a", 9464, true, {} }
  it("sandbox{} refuses anything but a loopback address and port, naming the fix", function()
    for _, value in ipairs(bad) do
      local ok, err = pcall(sandbox, options("/tmp/never-created-root", { metricsListen = value }))
      assert.is_false(ok, tostring(value))
      assert.equal(LOOPBACK, err, tostring(value))
    end
    assert.truthy(require("sandbox.errors").fix(LOOPBACK):find('metricsListen = "127.0.0.1:9464"', 1, true))
    for _, good in ipairs { "127.0.0.1:9464", "127.8.9.10:1", "[::1]:9464", "127.0.0.1:0" } do
      assert.truthy(sandbox(options("/tmp/never-created-root", { metricsListen = good })), good)
    end
  end)

  it("sandbox.runtime{} refuses it at construction and starts nothing", function()
    if not spec_fs.service_account(pending) then return end
    for _, value in ipairs { "0.0.0.0:9464", "[::]:0", "localhost:0" } do
      local root = spec_fs.tmpdir("ml", roots, spec_fs.short_tmp())
      local ok, err = pcall(sandbox.runtime, options(root, { metricsListen = value, driver = fake.new(fake.reply(true, "")) }))
      assert.is_false(ok)
      assert.equal(LOOPBACK, err)
    end
  end)

  it("serves GET /metrics from the engine's own loop; other paths 404, other methods 405, a body 413, a big head 431", function()
    if not spec_fs.service_account(pending) then return end
    local rt = runtime { driver = fake.new(fake.reply(true, "x")), metricsListen = "127.0.0.1:0" }
    local addr = assert(rt:metrics_address())
    assert.matches("^127%.0%.0%.1:%d+$", addr)
    local base = "http://" .. addr
    local res = async.run(function()
      rt:run_turn(CHANNEL, SPEAKER, "hi")
      return {
        ok = P.get(base .. "/metrics"),
        query = P.get(base .. "/metrics?x=1"),
        root = P.get(base .. "/"),
        post = P.get(base .. "/metrics", { "-X", "POST" }),
        body = P.get(base .. "/metrics", { "--data-binary", "x=1" }),
        big = P.get(base .. "/metrics", { "-H", "X-Big: " .. string.rep("a", 9000) }),
      }
    end)
    dispose(rt)
    assert.equal(200, res.ok.status)
    assert.equal("text/plain; version=0.0.4; charset=utf-8", res.ok.content_type)
    assert.equal(1, P.value(res.ok.body, 'sbx_turns_total{reason="ok"}'))
    assert.equal(404, res.query.status)
    assert.equal(404, res.root.status)
    assert.equal(405, res.post.status)
    assert.equal(413, res.body.status)
    assert.equal(431, res.big.status)
  end)

  it("serves /healthz and /readyz beside /metrics: liveness, then daemon, image, writable roots and descriptor room", function()
    if not spec_fs.service_account(pending) then return end
    local state = { daemon = true, image = true, daemon_calls = 0 }
    local driver = fake.new(fake.reply(true, "x"), {
      inspect_daemon = function()
        state.daemon_calls = state.daemon_calls + 1
        async.sleep(50)                       -- a daemon call takes a while: requests meanwhile share it
        if state.daemon then return { version = "99.0" } end
        return nil, "no answer"
      end,
      inspect_image = function() return state.image end,
    })
    local rt, root = runtime { driver = driver, metricsListen = "127.0.0.1:0" }
    local base = "http://" .. assert(rt:metrics_address())
    local res = async.run(function()
      local r = { live = P.get(base .. "/healthz"), ready = P.get(base .. "/readyz"),
                  post = P.get(base .. "/readyz", { "-X", "POST" }), query = P.get(base .. "/readyz?x=1") }
      async.sleep(health.CACHE_MS + 50)
      state.image = false
      local calls = state.daemon_calls
      local flood = {}
      for i = 1, 10 do flood[i] = async.spawn(P.get, base .. "/readyz") end
      for i = 1, 10 do local _, got = async.wait(flood[i]); flood[i] = got end
      r.flood, r.flood_calls = flood, state.daemon_calls - calls
      async.sleep(health.CACHE_MS + 50)
      state.image = true
      os.execute("chmod 0500 '" .. root .. "/work'")
      r.unwritable = P.get(base .. "/readyz")
      os.execute("chmod 0700 '" .. root .. "/work'")
      return r
    end)
    dispose(rt)
    assert.equal(200, res.live.status)
    assert.equal("ok\n", res.live.body)
    assert.equal(200, res.ready.status, res.ready.body)
    assert.matches("^ok   daemon      answers %(99%.0%)\nok   image       ", res.ready.body)
    assert.matches("\nok   writable    runRoot and workspaceRoot\nok   descriptors %d+ of %d+ free\n$", res.ready.body)
    assert.equal(405, res.post.status)
    assert.equal(404, res.query.status)
    for _, r in ipairs(res.flood) do
      assert.equal(503, r.status)
      assert.matches("\nFAIL image       .- is missing; fix: ", r.body)
    end
    assert.equal(1, res.flood_calls)          -- ten requests, one daemon call
    assert.equal(503, res.unwritable.status)
    assert.matches("FAIL writable    .-/work is not writable; fix: ", res.unwritable.body)
  end)

  it("serves on [::1] too, and stops serving once the runtime is disposed", function()
    if not spec_fs.service_account(pending) then return end
    local rt = runtime { driver = fake.new(fake.reply(true, "x")), metricsListen = "[::1]:0" }
    local addr = assert(rt:metrics_address())
    assert.matches("^%[::1%]:%d+$", addr)
    local before = async.run(function() return P.get("http://" .. addr .. "/metrics") end)
    dispose(rt)
    local after = async.run(function() return P.get("http://" .. addr .. "/metrics") end)
    assert.equal(200, before.status)
    assert.equal(0, after.status)
  end)

  it("a port already in use fails construction naming the cause, and releases the lock", function()
    if not spec_fs.service_account(pending) then return end
    local holder = assert(core.http_server { on_request = function(req) req:reply(200, "") end })
    local root = spec_fs.tmpdir("mb", roots, spec_fs.short_tmp())
    local o = options(root, { driver = fake.new(fake.reply(true, "")), metricsListen = "127.0.0.1:" .. holder:port() })
    local ok, err = pcall(sandbox.runtime, o)
    holder:close()
    assert.is_false(ok)
    assert.matches("^metricsListen could not listen: EADDRINUSE", err)
    assert.truthy(require("sandbox.errors").fix(err))
    o.metricsListen = nil
    local rt = sandbox.runtime(o)                      -- the lock was released
    dispose(rt)
  end)
end)

describe("promtool check metrics", function()
  it("passes on the exposition real turns produced (success, failures, a refusal)", function()
    if not P.have(P.PROMTOOL) then
      return pending("promtool is not installed: make deps installs Debian's prometheus package")
    end
    if not W.available() then return pending("build/worker/sbxw.so is not built (make)") end
    if not spec_fs.service_account(pending) then return end
    local rt = runtime { driver = W.driver(), upstreamRetries = 0 }
    script { call_tool("host_secret_tool_name"), text_reply("noon") }
    assert.is_true(turn(rt).ok)
    script { { status = 429, body = '{"error":{"code":"rate_limit_exceeded"}}' } }
    assert.equal("upstream_status", turn(rt).reason)
    local text = rt:metrics()
    local status, out = async.run(function() return P.promtool_check(text) end)
    dispose(rt)
    assert.equal(0, status, out .. "\n" .. text)
    assert.equal(1, P.value(text, 'sbx_upstream_responses_total{route_kind="model",status="429"}'))
  end)
end)

describe("one registry for every mode (issue 21 item 6)", function()
  local metrics = require "sandbox.ops.metrics"
  local record = require "sandbox.ops.record"

  it("a precheck run and a rich turn count in sbx_turns_total with their mode; a sealed turn's series keep no mode label", function()
    local m = metrics.new()
    m:add_mode("precheck")
    m:add_mode("rich")
    local rec = record.recorder()
    rec:subscribe(m:reader())
    local run = rec:run_begin("discord:1", 13)
    run.reason, run.fix = "script_error", nil
    rec:run_end(run)
    local t = rec:turn_begin("discord:1", "t1")
    t.mode, t.reason = "rich", "upstream_status"
    rec:turn_end(t)
    local s = rec:turn_begin("discord:1")
    s.reason = "ok"
    rec:turn_end(s)
    local text = m:render()
    assert.equal(1, P.value(text, 'sbx_turns_total{mode="precheck",reason="script_error"}'))
    assert.equal(0, P.value(text, 'sbx_turns_total{mode="precheck",reason="deadline"}'))
    assert.equal(1, P.value(text, 'sbx_turns_total{mode="rich",reason="upstream_status"}'))
    assert.equal(1, P.value(text, 'sbx_turns_total{reason="ok"}'))
    assert.equal(1, P.value(text, 'sbx_turn_duration_seconds_count'))
    assert.equal(1, P.value(text, 'sbx_turn_duration_seconds_count{mode="precheck"}'))
    assert.is_nil(text:find('mode="sealed"', 1, true))
    -- a mode outside the closed set is dropped, never a new series
    local x = rec:turn_begin("discord:1")
    x.mode, x.reason = "guest-chosen", "ok"
    rec:turn_end(x)
    assert.is_nil(m:render():find("guest-chosen", 1, true))
  end)

  it("each mode's registry exposes its own reasons from 0: script_error and run_dir only for precheck", function()
    local sealed = metrics.new():render()
    assert.is_nil(sealed:find("script_error", 1, true))
    local pre = metrics.new { mode = "precheck" }:render()
    assert.equal(0, P.value(pre, 'sbx_turns_total{mode="precheck",reason="run_dir"}'))
    assert.is_nil(pre:find('sbx_turns_total{reason=', 1, true))
  end)
end)

describe("process metrics, alert rules and the dashboard (issue 23 item 6)", function()
  it("exposes sbx_build_info{version} and the process families", function()
    local text = require("sandbox.ops.metrics").new():render()
    assert.equal(1, P.value(text, 'sbx_build_info{version="' .. core.version .. '"}'))
    assert.truthy(P.value(text, "process_start_time_seconds") > 1.7e9)
    assert.truthy(P.value(text, "process_open_fds") > 0)
    assert.truthy(P.value(text, "process_max_fds") > 0)
    assert.truthy(P.value(text, "process_resident_memory_bytes") > 1e6)
  end)

  -- metric names in a PromQL expression (words followed by { ( [ or a space,
  -- not functions or keywords)
  local KEYWORDS = { sum = true, by = true, rate = true, increase = true, histogram_quantile = true,
    clamp_min = true, time = true, le = true, on = true, without = true, e = true }
  local function names_in(expr)
    local out = {}
    for w in expr:gmatch("[%a_][%w_]*") do
      if not KEYWORDS[w] and (w:find("^sbx_") or w:find("^process_")) then out[#out + 1] = w end
    end
    return out
  end

  local function exposed()
    local text = require("sandbox.ops.metrics").new():render()
    local set = {}
    for name in text:gmatch("# TYPE ([%w_]+) ") do
      set[name] = true
      for _, suffix in ipairs { "_bucket", "_sum", "_count" } do set[name .. suffix] = true end
    end
    return set
  end

  it("examples/prometheus/sbx-alerts.yml passes promtool check rules and names only exposed metrics", function()
    if not P.have(P.PROMTOOL) then
      return pending("promtool is not installed: make deps installs Debian's prometheus package")
    end
    local status, out = async.run(function()
      local res = P.spawn(P.PROMTOOL, { "check", "rules", "examples/prometheus/sbx-alerts.yml" }, "", 30000)
      return res.exit_status, (res.stdout or "") .. (res.stderr or "")
    end)
    assert.equal(0, status, out)
    assert.matches("SUCCESS: 7 rules found", out, 1, true)
    local set, text = exposed(), spec_fs.read("examples/prometheus/sbx-alerts.yml")
    for expr in text:gmatch("expr: >?%s*([^\n]+)") do
      for _, name in ipairs(names_in(expr)) do assert.truthy(set[name], name .. " is not exposed") end
    end
  end)

  it("examples/grafana/sbx-dashboard.json is a dashboard whose every query names exposed metrics", function()
    local dash = json.decode(assert(spec_fs.read("examples/grafana/sbx-dashboard.json")))
    assert.equal("object", json.kind(dash))
    local set, n = exposed(), 0
    for _, panel in ipairs(dash.panels) do
      for _, t in ipairs(panel.targets) do
        n = n + 1
        for _, name in ipairs(names_in(t.expr)) do assert.truthy(set[name], name .. " is not exposed") end
      end
    end
    assert.truthy(n >= 8)
  end)
end)

