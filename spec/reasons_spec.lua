-- reasons_spec.lua: the turn reasons of spec/operations.md 1 that need no
-- container, each from a real cause through the real runtime, the real
-- broker on the turn's socket, the real worker Lua (worker_harness.lua's
-- driver) and a real loopback upstream: what rt:run_turn returns (reason,
-- fix, the provider's tokens) and the turn line. The same reasons through
-- `sbx run` on real Docker are spec/docker/reasons_spec.lua. Also: the
-- host's decision when the worker's claim contradicts what the host saw,
-- upstream_timeout on a stalled upstream (the call deadline is a broker
-- seam here), and the planted-secret grep over every line of full turns.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local sandbox = require "sandbox"
local reason = require "sandbox.ops.reason"
local fake_upstream = require "fake_upstream"
local stall_server = require "stall_server"
local spec_fs = require "spec_fs"
local H = require "broker_harness"
local C = require "log_capture"
local W = require "worker_harness"

if not W.available() then
  describe("turn reasons", function() pending("build/worker/sbxw.so is not built (make)") end)
  return
end

local KEY = "sk-planted-key-9QwZ"
local GUEST_TEXT = "GUEST-SECRET-TEXT-4471 please"
local TOOL_RESULT = "TOOL-RESULT-SECRET-8812"
local SPEAKER = { id = "guest", name = "Guest", principalId = "p_guest" }

local roots = {}
teardown(function() spec_fs.rmdirs(roots) end)

local up
setup(function() up = fake_upstream.start() end)
teardown(function() if up then up:stop() end end)

-- A runtime on the fake with the harness worker; every operator line kept.
local function runtime(over, format)
  spec_fs.service_account(pending)
  local root = spec_fs.tmpdir("rs", roots, spec_fs.short_tmp())
  local cap = C.new { format = format or "text" }
  local o = {
    image = "pi-roundtable-sandbox:local", runRoot = root .. "/run", workspaceRoot = root .. "/work",
    model = "spec-model", modelUrl = up:url("/v1/chat/completions"), allowHttp = true,
    apiKey = function() return KEY end, driver = W.driver(), logLevel = "debug",
    tools = { { name = "secret", description = "s", parameters = { type = "object" }, run = function() return TOOL_RESULT end } },
    logger = {
      debug = function(m, f) cap.logger:debug(m, f) end, info = function(m, f) cap.logger:info(m, f) end,
      warn = function(m, f) cap.logger:warn(m, f) end, error = function(m, f) cap.logger:error(m, f) end,
    },
  }
  for k, v in pairs(over or {}) do o[k] = v end
  if o.apiKey == false then o.apiKey = nil end
  return sandbox.runtime(o), cap, root
end

local function turn(rt, text, channel)
  return async.run(function()
    local r = rt:run_turn(channel or "fake:reasons", SPEAKER, text or "What time is it?")
    return r
  end)
end

local function script(list) async.run(function() up:reset() up:script(list) end) end

local function reply(message, finish)
  return { status = 200, body = json.encode(json.object({ "choices" }, { choices = json.array {
    json.object({ "index", "message", "finish_reason" }, { index = 0, message = message, finish_reason = finish or "stop" }) } })) }
end

local function call_tool(name)
  return reply(json.object({ "role", "content", "tool_calls" }, { role = "assistant", content = json.null,
    tool_calls = json.array { json.object({ "id", "type", "function" }, { id = "c1", type = "function",
      ["function"] = json.object({ "name", "arguments" }, { name = name, arguments = "{}" }) }) } }), "tool_calls")
end

local function text_reply(t) return reply(json.object({ "role", "content" }, { role = "assistant", content = t })) end

describe("reasons decided from a real cause (no container)", function()
  local cases = {
    { "upstream_status", { { status = 401, body = '{"error":{"code":"invalid_api_key","message":"' .. KEY .. '"}}' } }, nil,
      function(r) assert.equal(401, r.status) assert.equal("invalid_api_key", r.code) assert.equal("/model", r.route) end },
    { "upstream_invalid", { { status = 200, body = "<html>" } } },
    { "upstream_invalid", { { status = 200, body = '{"object":"list","data":[]}' } } },
    { "reflection", { text_reply("the key is " .. KEY) } },
    { "credential_missing", {}, { apiKey = function() return "" end } },
    { "credential_error", {}, { apiKey = function() error("vault: " .. KEY) end } },
    { "model_no_text", { text_reply("   ") } },
    { "model_filtered", { reply(json.object({ "role", "content" }, { role = "assistant", content = json.null }), "content_filter") } },
    { "context_budget", {}, { tools = { { name = "big", description = string.rep("d", 40000), parameters = { type = "object" },
      run = function() return "" end } } } },
  }
  for _, c in ipairs(cases) do
    it(c[1], function()
      if not spec_fs.service_account(pending) then return end
      script(c[2])
      local rt, cap = runtime(c[3])
      local r = turn(rt)
      async.run(function() rt:dispose() end)
      assert.is_false(r.ok)
      assert.equal(c[1], r.reason)
      assert.truthy(r.fix)
      assert.matches("^%x+$", r.turn)
      if c[4] then c[4](r) end
      local line = C.parse_text(assert(cap:find("turn finished")))
      assert.equal("warn", line.level)
      assert.equal(c[1], line.fields.reason)
      assert.equal(r.turn, line.fields.turn)
      assert.is_nil(table.concat(cap.lines, "\n"):find(KEY, 1, true))
    end)
  end

  it("upstream_unreachable: nothing listens at modelUrl", function()
    if not spec_fs.service_account(pending) then return end
    local rt, cap = runtime { modelUrl = string.format("http://127.0.0.1:%d/v1", fake_upstream.closed_port()) }
    local r = turn(rt)
    async.run(function() rt:dispose() end)
    assert.equal("upstream_unreachable", r.reason)
    -- the operator learns why no answer came, in the result and the turn line
    assert.equal("connection refused", r.cause)
    local line = C.parse_text(assert(cap:find("turn finished")))
    assert.equal("connection refused", line.fields.cause)
  end)

  it("upstream_unreachable names a failed name resolution", function()
    if not spec_fs.service_account(pending) then return end
    local rt, cap = runtime { modelUrl = "http://no-such-host.invalid/v1" }
    local r = turn(rt)
    async.run(function() rt:dispose() end)
    assert.equal("upstream_unreachable", r.reason)
    assert.equal("name resolution failed", r.cause)
    assert.equal("name resolution failed", C.parse_text(assert(cap:find("turn finished"))).fields.cause)
  end)

  it("invalid_turn, memory_store, history: the worker's own reasons, kept since nothing contradicts them", function()
    if not spec_fs.service_account(pending) then return end
    local rt = runtime { driver = W.driver(nil, function() return '{"text":5}' end) }
    assert.equal("invalid_turn", turn(rt).reason)
    async.run(function() rt:dispose() end)
    local cap, root
    rt, cap, root = runtime()
    local ws = root .. "/work/" .. core.sha256_hex("fake:reasons")
    os.execute("mkdir -m 700 '" .. ws .. "'")
    -- an invalid store is moved aside and the turn goes on (hardening.md 8):
    -- the turn is ok, the host's warn line names the worker's reason
    for _, c in ipairs { { "memory.json", "[1]", "memory_store" }, { "history.json", "{}", "history" } } do
      spec_fs.write(ws .. "/" .. c[1], c[2])
      script {}
      cap:clear()
      local r = turn(rt)
      assert.equal("ok", r.reason)
      local line = C.parse_text(assert(cap:find("worker repaired a store")))
      assert.equal("warn", line.level)
      assert.equal(c[3], line.fields.reason)
      assert.equal(r.turn, line.fields.turn)
      assert.truthy(line.fields.fix)
    end
    -- one the worker cannot move aside (a read-only workspace) fails the
    -- turn with the worker's own reason
    for _, c in ipairs { { "memory.json", "[1]", "memory_store" }, { "history.json", "{}", "history" } } do
      os.execute("chmod 700 '" .. ws .. "'")
      for _, name in ipairs(core.fs_readdir(ws)) do os.remove(ws .. "/" .. name) end
      spec_fs.write(ws .. "/" .. c[1], c[2])
      os.execute("chmod 500 '" .. ws .. "'")
      script {}
      assert.equal(c[3], turn(rt).reason)
    end
    os.execute("chmod 700 '" .. ws .. "'")
    async.run(function() rt:dispose() end)
  end)

  it("budget_exhausted: the worker's twelve model calls all asked for tools", function()
    if not spec_fs.service_account(pending) then return end
    local list = {}
    for i = 1, 12 do list[i] = call_tool("memory_get") end
    script(list)
    local rt = runtime()
    local r = turn(rt)
    async.run(function() rt:dispose() end)
    assert.equal("budget_exhausted", r.reason)
    assert.equal("The sandbox turn failed.", r.guest)
  end)

  it("tool_failed: counted on the turn line; the turn succeeds", function()
    if not spec_fs.service_account(pending) then return end
    script { call_tool("host_boom"), text_reply("Sorry.") }
    local rt, cap = runtime { tools = { { name = "boom", description = "b", parameters = { type = "object" },
      run = function() error("boom " .. KEY) end } } }
    local r = turn(rt)
    async.run(function() rt:dispose() end)
    assert.equal("ok", r.reason)
    local line = C.parse_text(assert(cap:find("turn finished")))
    assert.equal("1", line.fields.tool_failures)
    assert.equal("tool_failed", C.parse_text(assert(cap:find("route=/tools/boom"))).fields.reason)
  end)
end)

describe("a worker's claim never overrides what the host saw", function()
  it("a claimed model_filtered after a refused /model call is the call's reason", function()
    if not spec_fs.service_account(pending) then return end
    script { { status = 429, body = '{"error":{"code":"rate_limit_exceeded"}}' } }
    local lying = function(broker)
      return function(route, body)
        local status, v = broker(route, body)
        error("model output was filtered", 0)    -- the worker then claims model_filtered
        return status, v
      end
    end
    local rt = runtime { driver = W.driver(lying), upstreamRetries = 0 }
    local r = turn(rt)
    async.run(function() rt:dispose() end)
    assert.equal("upstream_status", r.reason)
    assert.equal(429, r.status)
  end)

  it("model_filtered or model_no_text without a model reply that backs it is worker_failed", function()
    local t = { last_model = nil }
    assert.equal("worker_failed", reason.decide(t, { error = "sandbox worker failed", worker_reason = "model_filtered" }))
    t.last_model = { status = 200, accepted = true, reply = { message = true, finish = "stop" } }
    assert.equal("worker_failed", reason.decide(t, { error = "sandbox worker failed", worker_reason = "model_filtered" }))
    assert.equal("model_no_text", reason.decide(t, { error = "sandbox worker failed", worker_reason = "model_no_text" }))
    t.last_model.reply.tool_calls = true
    assert.equal("worker_failed", reason.decide(t, { error = "sandbox worker failed", worker_reason = "model_no_text" }))
    assert.equal("worker_failed", reason.decide(t, { error = "sandbox worker failed", worker_reason = "deadline" }))
    assert.equal("worker_oom", reason.decide(t, { error = "sandbox worker was killed for memory", worker_reason = "history" }))
  end)
end)

describe("upstream_timeout", function()
  it("a model upstream that never answers within the call deadline", function()
    local stall = stall_server.start()
    finally(function() stall:stop() end)
    async.run(function()
      local cap = C.new()
      local o = H.options(up, { modelUrl = string.format("http://127.0.0.1:%d/v1/chat/completions", stall.silent_port),
        recorder = cap.recorder,
        listenTimeouts = { call_ms = 300 } })
      local b, path, dir = H.start(o)
      local r = H.post(path, "/model")
      H.finish(b, dir)
      assert.equal(502, r.status)
      local l = C.parse_text(assert(cap:find("broker call")))
      assert.equal("upstream_timeout", l.fields.reason)
      assert.equal("upstream_timeout", reason.decide({ last_model = { status = 502, accepted = true,
        reason = "upstream_timeout" } }, { error = "sandbox worker failed" }))
    end)
  end)
end)

describe("upstream_timeout at the default deadlines", function()
  it("is what the operator sees, not a closed connection, when the listener's request deadline would come first", function()
    local stall = stall_server.start()
    finally(function() stall:stop() end)
    async.run(function()
      local cap = C.new()
      local o = H.options(up, { modelUrl = string.format("http://127.0.0.1:%d/v1/chat/completions", stall.silent_port),
        recorder = cap.recorder,
        listenTimeouts = { call_ms = 2000, request_ms = 500 } })
      local b, path, dir = H.start(o)
      local r = H.post(path, "/model")
      H.finish(b, dir)
      assert.equal(502, r.status)
      local l = C.parse_text(assert(cap:find("broker call")))
      assert.equal("upstream_timeout", l.fields.reason)
      assert.equal("timed out", l.fields.cause)
    end)
  end)
end)

describe("the planted-secret grep (operations.md 2, item 3)", function()
  for _, format in ipairs { "text", "json" } do
    it("every " .. format .. " line of full turns holds no key, guest text or tool result", function()
      if not spec_fs.service_account(pending) then return end
      -- a turn that calls the tool and answers, one refused with the key and
      -- the guest text echoed in the provider's error, one reflecting the key
      script { call_tool("host_secret"), text_reply("Done: " .. TOOL_RESULT),
        { status = 400, body = '{"error":{"message":"' .. GUEST_TEXT .. " " .. KEY .. '","code":"' .. KEY .. '"}}' },
        text_reply(KEY) }
      local rt, cap = runtime({}, format)
      local r1 = turn(rt, GUEST_TEXT)
      local r2 = turn(rt, GUEST_TEXT)
      local r3 = turn(rt, GUEST_TEXT)
      async.run(function() rt:dispose() end)
      assert.equal("ok", r1.reason)
      assert.equal("upstream_status", r2.reason)
      assert.equal("reflection", r3.reason)
      assert.is_true(#cap.lines >= 10)
      for _, line in ipairs(cap.lines) do
        for _, secret in ipairs { KEY, "GUEST-SECRET-TEXT", "TOOL-RESULT-SECRET", "please" } do
          assert.is_nil(line:find(secret, 1, true), secret .. " in: " .. line)
        end
        if format == "json" then assert.equal("object", json.kind(assert(json.decode(line)))) end
      end
    end)
  end
end)
