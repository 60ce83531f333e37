-- provider_turns_spec.lua: a turn per provider family of spec/providers.md
-- ("Behaviours the specs must cover" 7) through the real runtime, the real
-- broker on the turn's real socket, the real worker Lua (the host build of
-- build/worker/sbxw.so) and that family's loopback server
-- (spec/fixtures/provider_upstream.mjs). Only the container is missing: the
-- same turns run sealed in real Docker in spec/docker/provider_turns_spec.lua.
-- Also the reasons these providers produce end to end: the 400 an OpenAI
-- reasoning model gives max_tokens (upstream_status with the
-- outputTokensField fix), DeepSeek's 400 when a turn drops reasoning_content,
-- and Azure's filtered reply (model_filtered).
local async = require "sandbox.async"
local json = require "sandbox.json"
local fake_upstream = require "fake_upstream"
local spec_fs = require "spec_fs"
local C = require "log_capture"
local P = require "provider_turns"
local W = require "worker_harness"

if not W.available() then
  describe("a turn per provider family", function() pending("build/worker/sbxw.so is not built (make)") end)
  return
end

local worker_driver = W.driver

local roots = {}
teardown(function() spec_fs.rmdirs(roots) end)

local function runtime_for(case, up, over)
  spec_fs.service_account(pending)
  local root = spec_fs.tmpdir("pt", roots, spec_fs.short_tmp())
  return P.runtime(root, case, up, (over and over.driver) or worker_driver(), over)
end

describe("a turn per provider family against its loopback server", function()
  for _, case in ipairs(P.FAMILIES) do
    it(case.name .. " answers the guest, with the options the README gives it", function()
      if not spec_fs.service_account(pending) then return end
      local up = fake_upstream.start_provider(case.name, P.KEY)
      finally(function() up:stop() end)
      local rt = runtime_for(case, up)
      local res, reqs = async.run(function()
        up:reset()
        local r = rt:run_turn("fake:" .. case.name, P.GUEST, "What time is it?")
        local log = up:log()
        rt:dispose()
        return r, log
      end)
      assert.equal("ok", res.reason, res.error)
      assert.equal(case.text, res.text)
      case.check(reqs, json)
    end)
  end
end)

describe("what these providers' refusals make of a turn", function()
  it("an OpenAI reasoning model's 400 to max_tokens: upstream_status naming the outputTokensField fix", function()
    if not spec_fs.service_account(pending) then return end
    local up = fake_upstream.start_provider("openai", P.KEY)
    finally(function() up:stop() end)
    local cap = C.new()
    local rt = runtime_for(P.FAMILIES[1], up, { outputTokensField = "max_tokens", logger = {
      info = function(m, f) cap.logger:info(m, f) end, warn = function(m, f) cap.logger:warn(m, f) end,
      error = function(m, f) cap.logger:error(m, f) end } })
    local res = async.run(function()
      local r = rt:run_turn("fake:openai", P.GUEST, "What time is it?")
      rt:dispose()
      return r
    end)
    assert.is_false(res.ok)
    assert.equal("upstream_status", res.reason)
    assert.equal(400, res.status)
    assert.equal("unsupported_parameter", res.code)
    assert.equal("max_tokens", res.param)
    assert.equal('set outputTokensField = "max_completion_tokens"', res.fix)
    assert.equal("The sandbox turn failed or was stopped.", res.guest)
    local line = C.parse_text(assert(cap:find("turn finished")))
    assert.equal("upstream_status", line.fields.reason)
    assert.equal("400", line.fields.status)
    assert.equal("unsupported_parameter", line.fields.code)
    assert.equal('set outputTokensField = "max_completion_tokens"', line.fields.fix)
  end)

  it("DeepSeek's thinking mode answers 400 when a turn drops reasoning_content: upstream_status", function()
    if not spec_fs.service_account(pending) then return end
    local up = fake_upstream.start_provider("deepseek", P.KEY)
    finally(function() up:stop() end)
    -- a worker that would not send the reasoning back (what this page fixes)
    local drop = function(broker)
      return function(route, body)
        return broker(route, (body:gsub(',"reasoning_content":"[^"]*"', "")))
      end
    end
    local rt = runtime_for(P.FAMILIES[3], up, { driver = worker_driver(drop) })
    local res = async.run(function()
      local r = rt:run_turn("fake:deepseek", P.GUEST, "What time is it?")
      rt:dispose()
      return r
    end)
    assert.equal("upstream_status", res.reason)
    assert.equal(400, res.status)
    assert.equal("invalid_request_error", res.code)
  end)

  it("Azure's content filter withholding the reply: model_filtered, decided with what the broker saw", function()
    if not spec_fs.service_account(pending) then return end
    local up = fake_upstream.start_provider("azure-filter", P.KEY)
    finally(function() up:stop() end)
    local rt = runtime_for(P.FAMILIES[2], up)
    local res = async.run(function()
      local r = rt:run_turn("fake:azure", P.GUEST, "Tell me something violent.")
      rt:dispose()
      return r
    end)
    assert.equal("model_filtered", res.reason)
    assert.equal("the provider's content filter withheld the reply to this message", res.fix)
  end)
end)
