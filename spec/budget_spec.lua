-- budget_spec.lua: the operator's `budget` hook (broker/_budget.lua, issue
-- 23 item 2) through the real runtime, the real broker on the turn's
-- socket, the real worker Lua (worker_harness.lua's driver) and a real
-- loopback upstream reporting usage: a refusal at admission and before a
-- model call, the generic guest text and the operator's budget_exceeded,
-- other channels unaffected, a raising hook failing closed, and
-- examples/daily_budget.lua's per-channel daily limits surviving a restart.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local sandbox = require "sandbox"
local fake_upstream = require "fake_upstream"
local spec_fs = require "spec_fs"
local C = require "log_capture"
local W = require "worker_harness"

if not W.available() then
  describe("the budget hook", function() pending("build/worker/sbxw.so is not built (make)") end)
  return
end

local daily_budget = dofile("examples/daily_budget.lua")

local SPEAKER = { id = "guest", name = "Guest", principalId = "p_guest" }
local GENERIC = "The sandbox turn failed or was stopped."

local roots = {}
teardown(function() spec_fs.rmdirs(roots) end)

local up
setup(function() up = fake_upstream.start() end)
teardown(function() if up then up:stop() end end)

local function reply(message, finish, usage)
  local names = { "choices" }
  local v = { choices = json.array { json.object({ "index", "message", "finish_reason" },
    { index = 0, message = message, finish_reason = finish or "stop" }) } }
  if usage then names[2] = "usage" v.usage = json.decode(usage) end
  return { status = 200, body = json.encode(json.object(names, v)) }
end

local function text_reply(t, usage)
  return reply(json.object({ "role", "content" }, { role = "assistant", content = t }), "stop", usage)
end

local function call_tool(usage)
  return reply(json.object({ "role", "content", "tool_calls" }, { role = "assistant", content = json.null,
    tool_calls = json.array { json.object({ "id", "type", "function" }, { id = "c1", type = "function",
      ["function"] = json.object({ "name", "arguments" }, { name = "host_clock", arguments = "{}" }) }) } }),
    "tool_calls", usage)
end

local function usage(i, o) return string.format('{"prompt_tokens":%d,"completion_tokens":%d}', i, o) end

local function script(list) async.run(function() up:reset() up:script(list) end) end

local function runtime(over, root)
  spec_fs.service_account(pending)
  root = root or spec_fs.tmpdir("bg", roots, spec_fs.short_tmp())
  local cap = C.new { format = "text" }
  local o = {
    image = "pi-roundtable-sandbox:local", runRoot = root .. "/run", workspaceRoot = root .. "/work",
    model = "spec-model", modelUrl = up:url("/v1/chat/completions"), allowHttp = true,
    apiKey = function() return "sk-budget-spec" end, driver = W.driver(), logLevel = "debug",
    tools = { { name = "clock", description = "c", parameters = { type = "object" }, run = function() return "noon" end } },
    logger = {
      debug = function(m, f) cap.logger:debug(m, f) end, info = function(m, f) cap.logger:info(m, f) end,
      warn = function(m, f) cap.logger:warn(m, f) end, error = function(m, f) cap.logger:error(m, f) end,
    },
  }
  for k, v in pairs(over or {}) do o[k] = v end
  return sandbox.runtime(o), cap, root
end

local function turn(rt, channel)
  return async.run(function()
    local reply_text, settled, res = rt:guest_turn(channel, SPEAKER, "What time is it?")
    return { text = reply_text, settled = settled, res = res }
  end)
end

local function dispose(rt) async.run(function() rt:dispose() end) end

local function settle_hooks() async.run(function() async.sleep(100) end) end

describe("the budget hook", function()
  it("is asked at admission, before each model call and once settled, with this turn's usage", function()
    local seen = {}
    script { call_tool(usage(100, 20)), text_reply("It is noon.", usage(130, 5)) }
    local rt = runtime { budget = function(scope)
      seen[#seen + 1] = { phase = scope.phase, channel = scope.channel, speaker = scope.speaker.id,
        input = scope.used.input, output = scope.used.output, calls = scope.used.model_calls,
        turn = scope.turn }
      return true
    end }
    local r = turn(rt, "fake:bg-a")
    settle_hooks()
    dispose(rt)
    assert.is_true(r.res.ok, r.res.reason)
    assert.same({ "admission", "model_call", "model_call", "settled" },
      { seen[1].phase, seen[2].phase, seen[3].phase, seen[4].phase })
    assert.same({ 0, 0, 0 }, { seen[1].input, seen[1].output, seen[1].calls })
    assert.same({ 100, 20, 1 }, { seen[3].input, seen[3].output, seen[3].calls })
    assert.same({ 230, 25, 2 }, { seen[4].input, seen[4].output, seen[4].calls })
    assert.equal("fake:bg-a", seen[1].channel)
    assert.equal("guest", seen[1].speaker)
    assert.equal(r.res.turn, seen[4].turn)
  end)

  it("refusing at admission: the generic guest text, budget_exceeded with its fix, no model call", function()
    script { text_reply("never", usage(1, 1)) }
    local rt, cap = runtime { budget = function(scope) return scope.channel ~= "fake:bg-spent" end }
    local r = turn(rt, "fake:bg-spent")
    local other = turn(rt, "fake:bg-other")
    dispose(rt)
    assert.is_false(r.res.ok)
    assert.equal(GENERIC, r.text)
    assert.equal("budget_exceeded", r.res.reason)
    assert.matches("budget hook refused", r.res.fix, 1, true)
    assert.is_true(other.res.ok, other.res.reason)        -- the refused channel only
    local l = C.parse_text(assert(cap:find("turn finished")))
    assert.equal("budget_exceeded", l.fields.reason)
    assert.equal(1, #async.run(function() return up:log() end))   -- only the other channel's call
  end)

  it("refusing a model call within the turn: the worker gets no answer, the turn is budget_exceeded", function()
    script { call_tool(usage(150, 10)), text_reply("never", usage(1, 1)) }
    local rt = runtime { budget = function(scope) return scope.used.input + scope.used.output < 100 end }
    local r = turn(rt, "fake:bg-mid")
    dispose(rt)
    assert.is_false(r.res.ok)
    assert.equal(GENERIC, r.text)
    assert.equal("budget_exceeded", r.res.reason)
    assert.equal(1, #async.run(function() return up:log() end))
  end)

  it("a hook that raises fails closed, named to the operator", function()
    local rt, cap = runtime { budget = function() error("ledger offline") end }
    local r = turn(rt, "fake:bg-raise")
    dispose(rt)
    assert.equal("budget_exceeded", r.res.reason)
    assert.truthy(cap:find("budget hook raised an error"))
    assert.is_nil(table.concat(cap.lines, "\n"):find("ledger offline", 1, true))
  end)

  it("must be a function", function()
    local ok, err = pcall(sandbox, { image = "x", runRoot = "/tmp/never", workspaceRoot = "/tmp/never2",
      model = "m", modelUrl = "https://x.example/v1", apiKey = function() return "k" end, budget = 5 })
    assert.is_false(ok)
    assert.equal("budget must be a function", err)
  end)
end)

describe("examples/daily_budget.lua", function()
  it("stops a channel once its tokens of the day reach the limit, others go on, and it survives a restart", function()
    local root = spec_fs.tmpdir("bgd", roots, spec_fs.short_tmp())
    local file = root .. "/budget.json"
    script { text_reply("one", usage(70, 10)), text_reply("two", usage(5, 5)), text_reply("three", usage(5, 5)) }
    local rt = runtime({ budget = daily_budget.new { file = file, limit = 60 } }, root)
    local first = turn(rt, "fake:bgd-a")       -- 80 tokens: allowed (0 spent before it)
    settle_hooks()
    local second = turn(rt, "fake:bgd-a")      -- 80 >= 60: refused
    local other = turn(rt, "fake:bgd-b")       -- another channel: allowed
    settle_hooks()
    dispose(rt)
    assert.is_true(first.res.ok, first.res.reason)
    assert.equal("budget_exceeded", second.res.reason)
    assert.is_true(other.res.ok, other.res.reason)
    local saved = json.decode(assert(core.read_file_nofollow(file, 65536)))
    assert.equal(os.date("!%Y-%m-%d"), saved.day)
    assert.equal(80, saved.used[core.sha256_hex("fake:bgd-a")])
    assert.equal(10, saved.used[core.sha256_hex("fake:bgd-b")])
    assert.is_nil(core.read_file_nofollow(file, 65536):find("bgd", 1, true))   -- no channel key in the file
    -- a restart: a new runtime and hook over the same file
    rt = runtime({ budget = daily_budget.new { file = file, limit = 60 } }, spec_fs.tmpdir("bgd2", roots, spec_fs.short_tmp()))
    local after = turn(rt, "fake:bgd-a")
    local b_again = turn(rt, "fake:bgd-b")
    dispose(rt)
    assert.equal("budget_exceeded", after.res.reason)
    assert.is_true(b_again.res.ok, b_again.res.reason)
  end)
end)
