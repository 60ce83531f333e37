-- credential_spec.lua: calling the operator's apiKey hooks
-- (lua/sandbox/broker/_credential.lua; spec/broker.md 9.6, 11.2,
-- spec/runtime.md 2.3): a fresh scope per call, the hook raced against the
-- call signal, and the rules for a usable credential.
local async = require "sandbox.async"
local core = require "sandbox.core"
local credential = require "sandbox.broker._credential"
local signal = require "sandbox.signal"

local SPEAKER = { id = "alice", name = "Alice", principalId = "p_alice" }

describe("scope", function()
  it("is a fresh copy each time, so a hook's changes reach nothing", function()
    local a = credential.scope("fake:a", SPEAKER)
    local b = credential.scope("fake:a", SPEAKER)
    assert.same({ channel = "fake:a", speaker = { id = "alice", name = "Alice", principalId = "p_alice" } }, a)
    assert.are_not.equal(a, b)
    assert.are_not.equal(SPEAKER, a.speaker)
    a.speaker.principalId = "owner"
    assert.equal("p_alice", SPEAKER.principalId)
  end)
end)

describe("valid", function()
  it("is a non-empty string of visible ASCII up to 4096 bytes", function()
    assert.is_true(credential.valid("sk-live_123"))
    assert.is_true(credential.valid(string.rep("k", 4096)))
    for _, bad in ipairs { "", string.rep("k", 4097), "a b", "a\r\nX-Evil: 1", "é", 42 } do
      assert.is_false(credential.valid(bad), tostring(bad))
    end
  end)
end)

describe("call_hook", function()
  it("runs the hook as its own task and returns what it returned, yielding included", function()
    local sig = signal.new()
    assert.same({ "ok", "k1" }, { async.run(function()
      return credential.call_hook(function(scope)
        async.sleep(1)
        return "k1" .. (scope.speaker.id == "alice" and "" or "?")
      end, credential.scope("c:1", SPEAKER), sig)
    end) })
  end)

  it("is an error when the hook raises, the signal aborted before, or aborts during the call", function()
    local sig = signal.new()
    assert.equal("error", async.run(function()
      return credential.call_hook(function() error("boom") end, {}, sig)
    end))
    local called = false
    local early = signal.new()
    early:abort("turn ended")
    assert.equal("error", async.run(function()
      return credential.call_hook(function() called = true return "k" end, {}, early)
    end))
    assert.is_false(called)
    local late = signal.new()
    assert.equal("error", async.run(function()
      core.timer(5, function() late:abort("client closed") end)
      return credential.call_hook(function() async.sleep(200) return "k" end, {}, late)
    end))
  end)
end)

describe("the route rules", function()
  local sig
  before_each(function() sig = signal.new() end)
  local function model(hook) return async.run(function() return credential.for_model(hook, {}, sig) end) end
  local function mcp(hook) return { async.run(function() return credential.for_mcp(hook, {}, sig) end) } end

  it("/model fails closed on anything but a valid credential", function()
    assert.equal("k", model(function() return "k" end))
    assert.is_nil(model(nil))
    assert.is_nil(model(function() return nil end))
    assert.is_nil(model(function() return "" end))
    assert.is_nil(model(function() return 7 end))
    assert.is_nil(model(function() error("x") end))
  end)

  it("/mcp: no hook, nil or \"\" is unauthenticated; a bad value or a raise is an error", function()
    assert.same({ "none" }, mcp(nil))
    assert.same({ "none" }, mcp(function() return nil end))
    assert.same({ "none" }, mcp(function() return "" end))
    assert.same({ "key", "m" }, mcp(function() return "m" end))
    assert.same({ "error", "credential_missing" }, mcp(function() return "a b" end))
    assert.same({ "error", "credential_error" }, mcp(function() error("x") end))
  end)
end)
