-- rich/broker_tools_spec.lua: host tools and MCP through a rich broker's
-- real socket (spec/rich-mode.md 12, 13; behaviours 81-91), MCP against a
-- real server on the official SDK: bound identity, rebuilt answers, the
-- method allow-list, the startup scope and its re-arming, sessions.
local async = require "sandbox.async"
local core = require "sandbox.core"
local harness = require "rich_harness"
local json = require "sandbox.json"
local mcp_server = require "mcp_server"

local function run(fn) return async.run(fn) end

local function clock()
  local c = { offset = 0 }
  c.now = function() return core.now() + c.offset end
  c.timer = core.timer
  return c
end

local function rpc(method, params, id)
  return json.encode(json.object({ "jsonrpc", "id", "method", "params" },
    { jsonrpc = "2.0", id = id, method = method, params = params and json.jsonable(params) or nil }))
end

local INIT = { protocolVersion = "2025-06-18", capabilities = {}, clientInfo = { name = "spec", version = "1" } }

describe("rich broker: host tools (12)", function()
  local h, calls
  before_each(function()
    calls = {}
    h = harness.new { over = { tools = { names = { "whoami", "extra", "bad", "boom" }, call = function(name, input, ctx)
      calls[#calls + 1] = { name = name, input = input, ctx = ctx }
      if name == "whoami" then return { ok = true, text = ctx.channel .. "/" .. ctx.profile .. "/" .. ctx.speaker.principalId } end
      if name == "extra" then return { ok = true, text = "t", secret = "host-only", error = "e", admin = true } end
      if name == "bad" then return { ok = "yes" } end
      error("tool exploded")
    end } } }
  end)
  after_each(function() h:stop() end)

  it("B81: the callback sees the bound channel, profile and speaker, never the body's, and 410 after abort", function()
    run(function()
      local _, sig = h:bind { channel = "discord:party", profile = "main",
        speaker = { id = "123", name = "Ann", principalId = "ann" }, thinking = "medium" }
      local r = h:post("/tools/whoami", { input = { q = 1 }, channel = "discord:owner", author = { id = "owner" },
        speaker = { id = "owner", principalId = "owner" }, target = "x", credential = "y" })
      assert.equal(200, r.status)
      assert.same({ ok = true, text = "discord:party/main/ann" }, json.plain(json.decode(r.body)))
      local ctx = calls[1].ctx
      assert.same({ id = "123", name = "Ann", principalId = "ann" }, ctx.speaker)
      assert.equal("medium", ctx.thinking)
      assert.is_table(ctx.signal)
      assert.same({ q = 1 }, json.plain(calls[1].input))
      assert.equal(400, h:post("/tools/whoami", { input = "x" }).status)
      assert.equal("Invalid tool input", h:post("/tools/whoami", { nope = 1 }).body)
      sig:abort("turn over")
      local after = h:post("/tools/whoami", { input = {} })
      assert.equal(410, after.status)
      assert.equal(1, #calls)                    -- the refused bodies never reached the callback
    end)
  end)

  it("B82/B83: fields beyond ok/text/error/image/privateTo are dropped; a bad shape or a throw gives 502", function()
    run(function()
      h:bind()
      local r = h:post("/tools/extra", { input = {} })
      assert.equal('{"ok":true,"text":"t","error":"e"}', r.body)
      for _, name in ipairs { "bad", "boom" } do
        local x = h:post("/tools/" .. name, { input = {} })
        assert.equal(502, x.status)
        assert.equal("Broker call failed", x.body)
      end
    end)
    local w = h:warns("sandbox upstream call failed")
    assert.equal("tool:bad", w[1].upstream)
    assert.equal("Invalid tool output", w[1].error)
    assert.equal("tool:boom", w[2].upstream)
    assert.matches("tool exploded", w[2].error, 1, true)
  end)
end)

describe("rich broker: MCP (13)", function()
  local server, h, c
  setup(function() server = mcp_server.start { require_key = harness.MCP_KEY } end)
  teardown(function() server:stop() end)
  before_each(function()
    c = clock()
    h = harness.new { mcp = server, seams = { clock = c } }
  end)
  after_each(function() h:stop() end)

  local function methods_seen()
    local out = {}
    for _, e in ipairs(server:log() or {}) do out[#out + 1] = e.body and e.body.method or "?" end
    return out
  end

  it("B84-B87: startup metadata, then declared calls in the turn, refusals, 410 after release", function()
    run(function()
      local before = #(server:log() or {})
      local r = h:post("/mcp/docs", rpc("initialize", INIT, 1))
      assert.equal(200, r.status)
      assert.matches('"serverInfo"', r.body, 1, true)
      assert.equal(202, h:post("/mcp/docs", rpc("notifications/initialized")).status)
      r = h:post("/mcp/docs", rpc("tools/list", {}, 2))
      assert.equal(200, r.status)
      assert.matches('"search"', r.body, 1, true)
      r = h:post("/mcp/docs", rpc("tools/call", { name = "search", arguments = { query = "q" } }, 3))
      assert.equal(403, r.status)
      assert.equal("MCP method refused", r.body)
      assert.equal(410, h:model().status)           -- the startup scope carries no model call
      local release = h:bind()
      r = h:post("/mcp/docs", rpc("tools/call", { name = "search", arguments = { query = "moon" } }, 4))
      assert.equal(200, r.status)
      assert.matches("results for moon", r.body, 1, true)
      for _, bad in ipairs {
        rpc("resources/read", { uri = "file:///etc/passwd" }, 5), rpc("prompts/get", { name = "x" }, 6),
        rpc("sampling/createMessage", {}, 7), rpc("tools/call", { name = "delete", arguments = { id = "1" } }, 8),
        rpc("tools/call", { name = "search", arguments = "q" }, 9), rpc("tools/call", { name = "search" }, 10),
      } do
        assert.equal(403, h:post("/mcp/docs", bad).status)
      end
      release()
      assert.equal(410, h:post("/mcp/docs", rpc("tools/list", {}, 11)).status)
      local log = server:log()
      local seen = {}
      for i = before + 1, #log do
        seen[#seen + 1] = log[i].body.method
        assert.equal("Bearer " .. harness.MCP_KEY, log[i].authorization)
      end
      assert.same({ "initialize", "notifications/initialized", "tools/list", "tools/call" }, seen)
    end)
  end)

  it("B88/B89: discovery within 10 s of the last arm does not re-arm; 11 s later it does, metadata only", function()
    run(function()
      local release = h:bind()
      release()
      assert.equal(410, h:post("/mcp/docs", rpc("tools/list", {}, 1)).status)
      c.offset = 5000
      local d = h:get("/mcp-tools")
      assert.equal('{"servers":[{"name":"docs","tools":["search"]}]}', d.body)
      assert.equal(410, h:post("/mcp/docs", rpc("tools/list", {}, 2)).status)
      c.offset = 11000
      h:get("/mcp-tools")
      assert.equal(200, h:post("/mcp/docs", rpc("initialize", INIT, 3)).status)
      assert.equal(200, h:post("/mcp/docs", rpc("tools/list", {}, 4)).status)
      assert.equal(403, h:post("/mcp/docs", rpc("tools/call", { name = "search", arguments = { query = "q" } }, 5)).status)
      assert.equal(410, h:model().status)
      assert.equal(404, h:post("/mcp/other", rpc("tools/list", {}, 6)).status)
      -- a fresh arm expires after 90 s
      c.offset = 11000 + 90000
      assert.equal(410, h:post("/mcp/docs", rpc("tools/list", {}, 7)).status)
    end)
  end)

  it("B90: an RPC batch gets 400 Invalid input", function()
    run(function()
      local r = h:post("/mcp/docs", "[" .. rpc("tools/list", {}, 1) .. "]")
      assert.equal(400, r.status)
      assert.equal("Invalid input", r.body)
    end)
  end)

  it("the MCP credential is read on every call; nil gives 502 and reaches no server", function()
    h:stop()
    local n = 0
    h = harness.new { mcp = server, over = { mcp = { servers = { { name = "docs", url = server.url, tools = { "search" } } },
      token = function() n = n + 1 if n > 1 then return nil end return harness.MCP_KEY end } } }
    run(function()
      local before = #(server:log() or {})
      assert.equal(200, h:post("/mcp/docs", rpc("initialize", INIT, 1)).status)
      assert.equal(502, h:post("/mcp/docs", rpc("tools/list", {}, 2)).status)
      assert.equal(before + 1, #server:log())
    end)
  end)
end)

describe("rich broker: MCP sessions (13.1)", function()
  local server, h
  setup(function() server = mcp_server.start { stateful = true } end)
  teardown(function() server:stop() end)
  after_each(function() h:stop() end)

  it("B91/B71: mcp-session-id passes both ways within 256 bytes; an MCP 404 passes through", function()
    h = harness.new { mcp = server, over = { mcp = { servers = { { name = "docs", url = server.url, tools = { "search" } } } } } }
    run(function()
      local r = h:post("/mcp/docs", rpc("initialize", INIT, 1))
      assert.equal(200, r.status)
      local sid = r.headers["mcp-session-id"]
      assert.is_string(sid)
      local hdr = { "Mcp-Session-Id: " .. sid, "Mcp-Protocol-Version: 2025-06-18" }
      assert.equal(202, h:post("/mcp/docs", rpc("notifications/initialized"), hdr).status)
      r = h:post("/mcp/docs", rpc("tools/list", {}, 2), hdr)
      assert.equal(200, r.status)
      local log = server:log()
      assert.equal(sid, log[#log].headers["mcp-session-id"])
      assert.equal("2025-06-18", log[#log].headers["mcp-protocol-version"])
      local lapsed = h:post("/mcp/docs", rpc("tools/list", {}, 3), { "Mcp-Session-Id: lapsed-session" })
      assert.equal(404, lapsed.status)
      assert.matches("Session not found", lapsed.body, 1, true)
      local long = h:post("/mcp/docs", rpc("tools/list", {}, 4), { "Mcp-Session-Id: " .. string.rep("s", 257) })
      assert.equal(404, long.status)
      log = server:log()
      assert.is_nil(log[#log].headers["mcp-session-id"])
    end)
  end)
end)
