-- audit_spec.lua: the broker's payload-free audit trail (spec/operations.md
-- 3, "Behaviours the specs must cover" 4): one line per broker request after
-- it settles, `broker call` for the accepted ones and `broker refused` with
-- the reason for every refusal, each reason produced here by a real hostile
-- request over the real socket (the C listener hands the step that refused
-- to Lua as data). `not_bound` belongs to warm turns (spec/warm-turns.md),
-- which do not exist yet. `audit = false` turns the lines off.
local async = require "sandbox.async"
local core = require "sandbox.core"
local sandbox = require "sandbox"
local H = require "broker_harness"
local C = require "log_capture"
local fake_upstream = require "fake_upstream"
local unix_request = require "unix_request"

local run = async.run
local fake

setup(function() fake = fake_upstream.start() end)
teardown(function() if fake then fake:stop() end end)

local CHANNEL = "fake:guests"

local function with_broker(over, fn, cap_opts)
  return run(function()
    fake:reset()
    local cap = C.new(cap_opts)
    local o = H.options(fake, over)
    o.recorder = cap.recorder
    o.listenTimeouts = { header_ms = 300, request_ms = 400 }
    local b, path, dir = H.start(o)
    local ok, err = pcall(fn, b, path, cap)
    H.finish(b, dir)
    if not ok then error(err, 0) end
  end)
end

-- The audit lines (broker call / broker refused), parsed.
local function audit(cap)
  local out = {}
  for _, l in ipairs(cap.lines) do
    if l:find(" broker call ", 1, true) or l:find(" broker refused ", 1, true) then out[#out + 1] = C.parse_text(l) end
  end
  return out
end

local function last_refusal(cap)
  local a = audit(cap)
  local r = a[#a]
  assert(r and r.msg == "broker refused", "no refusal line:\n" .. table.concat(cap.lines, "\n"))
  return r
end

-- Sends raw bytes and waits until the broker wrote the line of that request.
local function send(path, bytes, cap, n)
  local before = #audit(cap)
  local r = H.send(path, bytes, { timeout_ms = 5000 })
  require("spec_fs").wait_for(function() return #audit(cap) >= before + (n or 1) end, "the audit line")
  return r
end

local function send_plain(path, bytes)
  return H.send(path, bytes, { timeout_ms = 5000 })
end

local STD = { { "Host", "broker" }, { "Content-Type", "application/json" }, { "Authorization", H.DUMMY } }
local function with_header(name, value)
  local h = { table.unpack(STD) }
  h[#h + 1] = { name, value }
  return h
end

describe("one audit line per broker request", function()
  it("an accepted call: route, status, ms, upstream status, bytes in and out, channel and turn", function()
    with_broker({}, function(_, path, cap)
      local body = '{"messages":[]}'
      local r = send(path, H.raw("/model", body), cap)
      assert.equal(200, r.status)
      local a = audit(cap)
      assert.equal(1, #a)
      local l = a[1]
      assert.equal("info", l.level)
      assert.equal("broker call", l.msg)
      assert.same({ "channel", "turn", "route", "status" }, { table.unpack(l.order, 1, 4) })
      assert.equal(CHANNEL, l.fields.channel)
      assert.matches("^%x+$", l.fields.turn)
      assert.equal("/model", l.fields.route)
      assert.equal("200", l.fields.status)
      assert.equal("200", l.fields.upstream_status)
      assert.equal(tostring(#body), l.fields.bytes_in)
      assert.equal(tostring(#r.body), l.fields.bytes_out)
      assert.matches("^%d+$", l.fields.ms)
    end)
  end)

  local cases = {
    { "unknown_route", 404, function() return H.raw("/tools/exec", "{}") end },
    { "method", 404, function() return H.raw("/model", "{}", nil, { method = "GET" }) end },
    { "query", 404, function() return H.raw("/model?url=https://guest.example", "{}") end },
    { "query", 404, function() return H.raw("/model#x", "{}") end },
    { "header", 403, function() return H.raw("/model", "{}", with_header("X-Provider-Token", "t")) end, "x-provider-token" },
    { "header", 403, function() return H.raw("/model", "{}", with_header("Cookie", "a=b")) end, "cookie" },
    { "header", 403, function()
        return H.raw("/model", "{}", { { "Host", "api.example" }, { "Authorization", H.DUMMY } })
      end, "host" },
    { "header", 400, function() return "POST /model HTTP/1.1\r\nHost: broker\r\n folded\r\nContent-Length: 2\r\n\r\n{}" end },
    { "method", 400, function() return "POST /model HTTP/2.0\r\nHost: broker\r\nContent-Length: 2\r\n\r\n{}" end },
    { "credential_header", 403, function()
        return H.raw("/model", "{}", { { "Host", "broker" }, { "Authorization", "Bearer stolen" } })
      end },
    { "body_too_large", 502, function()
        return "POST /model HTTP/1.1\r\nHost: broker\r\nContent-Length: 300000\r\n\r\n"
      end },
    { "malformed_json", 502, function() return H.raw("/model", "not json") end },
    { "malformed_json", 502, function() return H.raw("/model", "") end },
    -- within the size limit but ~80x its size once decoded: refused after the
    -- scan, before anything is built (core/bounds.h SBX_BODY_MEMORY_*)
    { "body_too_large", 502, function()
        return H.raw("/model", '{"messages":[' .. string.rep("{},", 80000) .. '{}]}')
      end },
    { "payload", 400, function() return H.raw("/model", "[]") end },
    { "payload", 400, function() return H.raw("/model", '{"messages":"x"}') end },
  }
  for _, c in ipairs(cases) do
    it("refused with reason " .. c[1] .. " (" .. c[2] .. ")", function()
      with_broker({}, function(_, path, cap)
        local r = send(path, c[3](), cap)
        assert.equal(c[2], r.status)
        local l = last_refusal(cap)
        assert.equal("warn", l.level)
        assert.equal(c[1], l.fields.reason)
        assert.equal(tostring(c[2]), l.fields.status)
        assert.equal(CHANNEL, l.fields.channel)
        assert.matches("^%x+$", l.fields.turn)
        assert.equal(c[4], l.fields.header)
        -- never the guest's target, values or body
        local line = table.concat(cap.lines, "\n")
        for _, secret in ipairs { "guest.example", "stolen", "a=b", "api.example", "exec" } do
          assert.is_nil(line:find(secret, 1, true), line)
        end
        if c[1] == "unknown_route" then assert.equal("-", l.fields.route) end
        assert.equal(0, #fake:log())
      end)
    end)
  end

  it("refused with reason budget once maxCalls are spent, after_turn once the turn ended", function()
    with_broker({ maxCalls = 1 }, function(b, path, cap)
      assert.equal(200, send(path, H.raw("/model", '{"messages":[]}'), cap).status)
      assert.equal(429, send(path, H.raw("/model", '{"messages":[]}'), cap).status)
      local l = last_refusal(cap)
      assert.equal("budget", l.fields.reason)
      assert.equal("/model", l.fields.route)
      b:end_turn()
      assert.equal(410, send(path, H.raw("/model", '{"messages":[]}'), cap).status)
      assert.equal("after_turn", last_refusal(cap).fields.reason)
    end)
  end)

  it("refused with reason busy while a call is in flight; the call's own line follows", function()
    local release
    local tool = { name = "wait", description = "w", parameters = { type = "object" }, run = function()
      async.await(function(resume) release = resume end)
      return "done"
    end }
    with_broker({ tools = { tool } }, function(_, path, cap)
      local first = async.spawn(function() return H.send(path, H.raw("/tools/wait", "{}")) end)
      require("spec_fs").wait_for(function() return release ~= nil end, "the tool")
      assert.equal(429, send(path, H.raw("/model", '{"messages":[]}'), cap).status)
      assert.equal("busy", last_refusal(cap).fields.reason)
      release()
      local _, r = async.wait(first)
      assert.equal(200, r.status)
      require("spec_fs").wait_for(function() return #audit(cap) == 2 end, "the tool's line")
      local l = audit(cap)[2]
      assert.equal("broker call", l.msg)
      assert.equal("/tools/wait", l.fields.route)
    end)
  end)

  it("refused with reason connections over the cap, header_deadline for a head that never completes", function()
    with_broker({}, function(_, path, cap)
      local handles, done = {}, 0
      for i = 1, 17 do
        handles[i] = unix_request(path, "POST /model HTTP/1.1\r\n", { keep_open = true, timeout_ms = 5000 },
          function() done = done + 1 end)
      end
      local wait_for = require("spec_fs").wait_for
      wait_for(function() return done == 17 end, "every connection closed")
      wait_for(function() return #audit(cap) == 17 end, "17 lines")
      local reasons = {}
      for _, l in ipairs(audit(cap)) do reasons[l.fields.reason] = (reasons[l.fields.reason] or 0) + 1 end
      assert.same({ connections = 1, header_deadline = 16 }, reasons)
      for _, l in ipairs(audit(cap)) do assert.equal("0", l.fields.status) end
    end)
  end)

  it("refused with reason request_deadline for a body that never completes, and for a call that outlives it", function()
    local tool = { name = "slow", description = "s", parameters = { type = "object" }, run = function(_, ctx)
      async.await(function(resume) ctx.signal:on_abort(function() resume() end) end)
      return "late"
    end }
    with_broker({ tools = { tool } }, function(_, path, cap)
      local wait_for = require("spec_fs").wait_for
      local closed = false
      unix_request(path, "POST /model HTTP/1.1\r\nHost: broker\r\nContent-Length: 20\r\n\r\n{\"mess",
        { keep_open = true, timeout_ms = 5000 }, function() closed = true end)
      wait_for(function() return closed and #audit(cap) == 1 end, "the body deadline")
      local l = last_refusal(cap)
      assert.equal("request_deadline", l.fields.reason)
      assert.equal("/model", l.fields.route)
      local r = H.send(path, H.raw("/tools/slow", "{}"), { timeout_ms = 5000 })
      assert.is_true(r.closed)
      wait_for(function() return #audit(cap) == 2 end, "the call's line")
      local call = audit(cap)[2]
      assert.equal("broker refused", call.msg)
      assert.equal("/tools/slow", call.fields.route)
      assert.equal("request_deadline", call.fields.reason)
      assert.equal("0", call.fields.status)
    end)
  end)

  it("audit = false writes none of these lines; a provider's refusal is still logged", function()
    with_broker({}, function(_, path, cap)
      fake:script { { status = 401, body = '{"error":{"code":"invalid_api_key"}}' } }
      assert.equal(404, send_plain(path, H.raw("/nope", "{}")).status)
      assert.equal(502, send_plain(path, H.raw("/model", '{"messages":[]}')).status)
      assert.same({}, audit(cap))
      require("spec_fs").wait_for(function() return cap:find("model call refused upstream") ~= nil end, "the line")
    end, { audit = false })
  end)
end)

describe("the audit option of sandbox{} and sandbox.runtime{}", function()
  it("is a boolean, on by default", function()
    local o = { image = "i", runRoot = "/r", workspaceRoot = "/w", stateFile = "/s/c.json", model = "m",
      modelUrl = "https://m.example/v1", apiKey = function() return "k" end }
    assert.is_table(sandbox(o))
    o.audit = "no"
    assert.equal("audit must be a boolean", select(2, pcall(sandbox, o)))
    o.audit = false
    assert.is_table(sandbox(o))
    assert.is_number(core.now())
  end)
end)
