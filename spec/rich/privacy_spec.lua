-- rich/privacy_spec.lua: the host rules of the capability handshake
-- (spec/rich-mode.md 14.1; behaviours 92-100, which part 2 lists with the
-- worker's projection): the requirement is raised only by demand, and while
-- it is set a worker that lacks a capability gets no private payload and the
-- provider is never called. Real broker socket; the worker a rich_peer.
local async = require "sandbox.async"
local fixture = require "rich_fixture_driver"
local harness = require "rich_harness"
local json = require "sandbox.json"
local peer = require "rich_peer"
local rich = require "sandbox.rich"
local signal = require "sandbox.signal"
local spec_fs = require "spec_fs"
local upstream = require "anthropic_upstream"

local IMAGE = "pi-roundtable-sandbox:pi"
local REBUILD = "Sandbox worker image " .. IMAGE .. " lacks privateTo, readerRecords; "
  .. "rebuild this image with the installed core and sandbox packages"

local function run(fn) return async.run(fn) end

local function turn(memory, visibility)
  return { turnId = "t1", author = { id = "1", name = "Ann", principalId = "ann" }, text = "hi",
    memory = memory or "", memoryVisibility = visibility or "private", images = {}, thinking = "low" }
end

local function result_packet(id, r)
  if r.files then r.files = json.array() end
  return json.encode(json.jsonable({ turnId = id, result = r }))
end

describe("rich broker: the capability handshake (14.1)", function()
  local up, h
  setup(function() up = upstream.start() end)
  teardown(function() up:stop() end)
  before_each(function() async.run(function() up:reset() end) end)
  after_each(function() if h then h:stop() h = nil end end)

  local function broker(tool)
    h = harness.new { up = up, over = { workerImage = IMAGE, tools = { names = { "recall", "public" }, call = function(name, _, ctx)
      if name == "recall" then return { ok = true, text = "the secret is 42", privateTo = ctx.speaker.principalId } end
      return { ok = true, text = "public facts" }
    end } } }
    return h
  end

  it("B92: a worker with no capabilities completes a turn with a shared prompt and a public tool", function()
    broker()
    run(function()
      assert.equal(200, h:post("/worker/ready", "").status)
      h:bind()
      local res
      local t = async.spawn(function() res = h.b:execute(turn("party facts", "shared")) end)
      assert.equal(200, h:get("/worker/next").status)
      assert.equal(200, h:post("/tools/public", { input = {} }).status)
      assert.equal(200, h:model().status)
      assert.equal(200, h:post("/worker/result", result_packet("t1", { ok = true, text = "done", files = true })).status)
      async.wait(t)
      assert.equal("done", res.text)
      assert.is_false(h.b.requirement)
    end)
  end)

  it("B93: a private prompt, or privateHistory=true, against an old worker fails the turn naming the image; no provider call", function()
    broker()
    run(function()
      assert.equal(200, h:post("/worker/ready", '{"capabilities":{}}').status)
      h:bind()
      local ok, err = pcall(h.b.execute, h.b, turn("Ann's notes"))
      assert.is_false(ok)
      assert.equal(REBUILD, err)
      assert.is_nil(h.b.pending)
      assert.equal(0, #up:messages())
    end)
    h:stop()
    broker()
    run(function()
      assert.equal(200, h:post("/worker/ready", '{"capabilities":{"privateTo":true},"privateHistory":true}').status)
      h:bind()
      local ok, err = pcall(h.b.execute, h.b, turn("", "shared"))
      assert.is_false(ok)
      assert.equal("Sandbox worker image " .. IMAGE .. " lacks readerRecords; rebuild this image with the installed core and sandbox packages", err)
      assert.equal(0, #up:messages())
    end)
  end)

  it("B95/B96: a private tool result to a worker lacking a capability is 409 without its secret; the turn fails; later calls get 410", function()
    for _, caps in ipairs { "{}", '{"privateTo":true}', '{"readerRecords":true}' } do
      broker()
      run(function()
        assert.equal(200, h:post("/worker/ready", '{"capabilities":' .. caps .. '}').status)
        h:bind()
        local t = async.spawn(function() return h.b:execute(turn()) end)
        assert.equal(200, h:get("/worker/next").status)
        local r = h:post("/tools/recall", { input = {} })
        assert.equal(409, r.status)
        assert.is_nil(r.body:find("42", 1, true))
        assert.matches("^Sandbox worker image " .. IMAGE:gsub("%p", "%%%0") .. " lacks ", r.body)
        local ok, err = async.wait(t)
        assert.is_false(ok)
        assert.matches("rebuild this image", err, 1, true)
        assert.equal(410, h:model().status)
        assert.equal(0, #up:messages())
      end)
      h:stop()
      h = nil
    end
  end)

  it("B97: a later empty ready rejects an already queued private turn; its result then gets 409", function()
    broker()
    run(function()
      assert.equal(200, h:post("/worker/ready", '{"capabilities":{"privateTo":true,"readerRecords":true}}').status)
      h:bind()
      local t = async.spawn(function() return h.b:execute(turn("Ann's notes")) end)
      assert.is_true(h.b.requirement)
      assert.equal(200, h:get("/worker/next").status)
      assert.equal(200, h:post("/worker/ready", "").status)         -- a downgrade takes effect at once
      local ok, err = async.wait(t)
      assert.is_false(ok)
      assert.equal(REBUILD, err)
      assert.equal(409, h:post("/worker/result", result_packet("t1", { ok = true, text = "x", files = true })).status)
    end)
  end)

  it("B99: an upgraded worker receives privateTo in the tool JSON", function()
    broker()
    run(function()
      assert.equal(200, h:post("/worker/ready", '{"capabilities":{"privateTo":true,"readerRecords":true}}').status)
      h:bind()
      local r = h:post("/tools/recall", { input = {} })
      assert.equal(200, r.status)
      assert.equal('{"ok":true,"text":"the secret is 42","privateTo":"ann"}', r.body)
      assert.is_true(h.b.requirement)
    end)
  end)
end)

describe("rich runtime: the handshake through runTurn (14.1)", function()
  local dirs = {}
  teardown(function() spec_fs.rmdirs(dirs) end)

  local function runtime(visibility, ready_body)
    local d = fixture.new { ready_body = ready_body, turn = function() return { ok = true, text = "ok", files = json.array() } end }
    local rt = rich {
      partyDir = spec_fs.tmpdir("rpv", dirs, spec_fs.short_tmp()) .. "/p", image = IMAGE,
      profiles = { main = { model = "m" } }, oauthToken = function() return "t" end,
      effort = { judge = function() return "low" end }, driver = d, logger = harness.logger({}),
      memory = { visibility = visibility, promptBlock = function() return "notes about the speaker" end },
    }
    return rt, d
  end

  it("B94/B100: with an old image a private block sends zero turns, a shared one succeeds; visibility is private by default", function()
    local rt, d = runtime(nil, '{"capabilities":{}}')
    local r
    run(function()
      r = rt:runTurn { channel = "discord:p", profile = "main", turnId = "t1", author = { id = "1", name = "A" }, text = "hi", images = {} }
      rt:stopBrokers()
    end)
    d.close()
    assert.is_false(r.ok)
    assert.equal("Sandbox turn failed: " .. REBUILD, r.error)
    local w = d.workers["roundtable-sandbox-discord_p"]
    assert.is_nil(w)
    local rt2, d2 = runtime("shared", '{"capabilities":{}}')
    run(function()
      r = rt2:runTurn { channel = "discord:p", profile = "main", turnId = "t1", author = { id = "1", name = "A" }, text = "hi", images = {} }
      rt2:stopBrokers()
    end)
    local seen = d2.workers["roundtable-sandbox-discord_p"].turns[1].turn
    d2.close()
    assert.is_true(r.ok)
    assert.equal("shared", seen.memoryVisibility)
    local rt3, d3 = runtime(nil, '{"capabilities":{"privateTo":true,"readerRecords":true}}')
    run(function()
      r = rt3:runTurn { channel = "discord:p", profile = "main", turnId = "t1", author = { id = "1", name = "A" }, text = "hi", images = {} }
      rt3:stopBrokers()
    end)
    seen = d3.workers["roundtable-sandbox-discord_p"].turns[1].turn
    d3.close()
    assert.is_true(r.ok)
    assert.equal("private", seen.memoryVisibility)
  end)
end)
