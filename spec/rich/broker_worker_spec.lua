-- rich/broker_worker_spec.lua: a rich broker's listener, routing and worker
-- transport over its real socket (spec/rich-mode.md 8-10; behaviours 32-51):
-- streaming with the silence limit, connection cap, mode and framing,
-- the order of checks, the budget, the body rules, and ready / next /
-- result / execute with their one-poll, one-turn, one-packet rules.
local async = require "sandbox.async"
local core = require "sandbox.core"
local engine = require "sandbox.drivers.engine"
local harness = require "rich_harness"
local json = require "sandbox.json"
local peer = require "rich_peer"
local signal = require "sandbox.signal"
local unix_request = require "unix_request"
local upstream = require "anthropic_upstream"

local TURN = { turnId = "t1", author = { id = "123", name = "Ann", principalId = "ann" }, text = "hi",
  memory = "", memoryVisibility = "private", images = {}, thinking = "high" }
local TURN_JSON = '{"turnId":"t1","author":{"id":"123","name":"Ann","principalId":"ann"},"text":"hi",'
  .. '"memory":"","memoryVisibility":"private","images":[],"thinking":"high"}'

local function run(fn) return async.run(fn) end

-- A clock whose long waits (the 45 s poll) pass in 50 ms, and whose now can
-- be moved on.
local function fast_clock()
  local c = { offset = 0 }
  c.now = function() return core.now() + c.offset end
  c.timer = function(ms, fn) return core.timer(ms >= 45000 and ms < 100000 and 50 or ms, fn) end
  return c
end

local function result_packet(turn_id, result)
  if result.files and #result.files == 0 then result.files = json.array() end
  return json.encode(json.jsonable({ turnId = turn_id, result = result }))
end

describe("rich broker: listener and routing (8, 9)", function()
  local up, h
  setup(function() up = upstream.start() end)
  teardown(function() up:stop() end)
  before_each(function() async.run(function() up:reset() end) end)
  after_each(function() if h then h:stop() h = nil end end)

  it("B32: with a 250 ms silence limit, the first chunk arrives before the rest, and four chunks 150 ms apart arrive whole", function()
    -- A one-byte token: the reflection stream holds back (longest form - 1)
    -- bytes, 3 here, so each chunk releases bytes at once (with a real
    -- token's 200-odd bytes of carry, a five-byte chunk waits for the next).
    h = harness.new { up = up, seams = { idleMs = 250 }, over = { oauthToken = function() return "k" end } }
    run(function()
      up:push { { chunks = { "first", "x", "x", "x", "x" }, gate = true, delayMs = 150 } }
      h:bind()
      local raw, ended, released = "", false, false
      local body = json.encode(json.jsonable({ stream = true, messages = { { role = "user", content = "long" } } }))
      peer.chunks(h.sock, peer.bytes("POST", "/anthropic/v1/messages", body), function(data)
        if data == nil then ended = true return end
        raw = raw .. data
        -- the rest is released only once the first chunk's bytes reached the
        -- worker (all but the reflection stream's carry): a broker that
        -- buffered the answer would never see them
        local head_end = raw:find("\r\n\r\n", 1, true)
        if not released and head_end and raw:find("fi", head_end, true) then
          assert.is_nil(raw:find("x", head_end, true))
          released = true
          async.spawn(function() up:release() end)
        end
      end)
      harness.eventually(function() return ended end, 10000)
      local status, _, b = engine.parse_response(raw)
      assert.equal(200, status, raw)
      assert.equal("firstxxxx", b)
    end)
  end)

  it("B33: a stalled request body is cut once the silence limit passes", function()
    h = harness.new { up = up, seams = { idleMs = 250 } }
    run(function()
      h:bind()
      local got
      unix_request(h.sock, "POST /anthropic/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mess",
        { keep_open = true, timeout_ms = 20000 }, function(r) got = r end)
      harness.eventually(function() return got ~= nil end, 15000)
      assert.is_true(got.ok)                       -- closed by the broker, not our timeout
      assert.equal(0, #up:messages())
    end)
  end)

  it("B34/B35: the 17th connection is closed without a response; the socket is 0600; answers say connection: close", function()
    h = harness.new { up = up }
    assert.equal(tonumber("600", 8), core.fs_stat(h.sock).mode)
    run(function()
      local held = {}
      for i = 1, 16 do
        held[i] = unix_request(h.sock, "GET /worker/next HTTP/1.1\r\n", { keep_open = true, timeout_ms = 20000 }, function() end)
      end
      harness.eventually(function() return h.b.server:stats().connections == 16 end)
      local r = peer.raw(h.sock, peer.bytes("GET", "/mcp-tools"))
      assert.equal("", r.data)
      for _, x in ipairs(held) do x:close() end
      harness.eventually(function() return h.b.server:stats().connections == 0 end)
      local ok = h:get("/mcp-tools")
      assert.equal(200, ok.status)
      assert.equal("close", ok.headers.connection)
    end)
  end)

  it("B36: a repeated header name gets 400 bad request and uses no budget", function()
    h = harness.new { up = up }
    run(function()
      h:bind()
      local before = h.b:stats().remaining
      local r = h:model(nil, { "X-App: cli", "x-app: again" })
      assert.equal(400, r.status)
      assert.equal("bad request", r.body)
      assert.equal(before, h.b:stats().remaining)
    end)
  end)

  it("B37/B38: account routes, other queries, unknown tools and servers, and non-canonical targets match nothing", function()
    h = harness.new { up = up }
    run(function()
      local release = h:bind()
      for _, t in ipairs { "/anthropic/v1/files", "/anthropic/v1/organizations", "/anthropic/v1/messages?endpoint=other",
          "/tools/shell", "/mcp/owner", "/anthropic/v1/./messages", "/anthropic/v1/messag%65s", "/anthropic/v1/messages/",
          "/anthropic/v1/messages?", "/anthropic//v1/messages", "/anthropic/v1/messages#x", "/tools/shell?beta=true" } do
        assert.equal(404, h:model(nil, nil, t).status, t)
      end
      assert.equal(404, h:get("/anthropic/v1/messages").status)
      release()
      local r = h:model()
      assert.equal(410, r.status)
      assert.equal("Turn ended", r.body)
      assert.equal(0, #up:messages())
    end)
  end)

  it("B39: the call after maxCalls, or a fifth concurrent one, gets 429 Broker budget exhausted", function()
    local gate = signal.new()
    h = harness.new { up = up, over = { tools = { names = { "count", "wait" }, call = function(name)
      if name == "wait" then async.await(function(resume) gate:on_abort(resume) end) end
      return { ok = true, text = "done" }
    end } } }
    run(function()
      local release = h:bind()
      for i = 1, 128 do assert.equal(200, h:post("/tools/count", { input = {} }).status, i) end
      local r = h:post("/tools/count", { input = {} })
      assert.equal(429, r.status)
      assert.equal("Broker budget exhausted", r.body)
      release()
      h:bind()
      local waiting = {}
      for i = 1, 4 do
        waiting[i] = async.spawn(function() return h:post("/tools/wait", { input = {} }) end)
      end
      harness.eventually(function() return h.b:stats().active == 4 end)
      assert.equal(429, h:post("/tools/count", { input = {} }).status)
      gate:abort("go")
      for i = 1, 4 do assert.equal(200, select(2, async.wait(waiting[i])).status) end
    end)
  end)

  it("B40: a body that is no object, nested over 64, or invalid UTF-8 gets 400 Invalid input", function()
    h = harness.new { up = up }
    run(function()
      h:bind()
      for _, b in ipairs { "[1,2]", string.rep("[", 65) .. string.rep("]", 65), '{"messages":"\255"}', "not json", '{"a":1}{' } do
        local r = h:post("/anthropic/v1/messages", b)
        assert.equal(400, r.status)
        assert.equal("Invalid input", r.body)
      end
      assert.equal(0, #up:messages())
    end)
  end)
end)

describe("rich broker: worker transport (10)", function()
  local h
  after_each(function() if h then h:stop() h = nil end end)

  it("B41: an empty ready body makes the broker ready; a malformed one does not", function()
    h = harness.new {}
    run(function()
      assert.is_false(h.b.ready)
      local r = h:post("/worker/ready", '{"capabilities":{"privateTo":"true"}}')
      assert.equal(400, r.status)
      assert.equal("Invalid ready handshake", r.body)
      assert.is_false(h.b.ready)
      assert.equal(400, h:post("/worker/ready", string.rep(" ", 16385)).status)
      r = h:post("/worker/ready", "")
      assert.equal(200, r.status)
      assert.equal("Ready", r.body)
      assert.is_true(h.b.ready)
      assert.equal(404, h:get("/worker/ready").status)
      assert.equal(404, h:post("/worker/other", "{}").status)
    end)
  end)

  it("B42/B43: a parked poll receives exactly the queued turn; a wrong turnId gets 409, the right one resolves it", function()
    h = harness.new {}
    run(function()
      local poll = async.spawn(function() return h:get("/worker/next") end)
      harness.eventually(function() return h.b.poll ~= nil end)
      local res
      local exec = async.spawn(function() res = h.b:execute(TURN) end)
      local _, p = async.wait(poll)
      assert.equal(200, p.status)
      assert.equal("application/json", p.headers["content-type"])
      assert.equal(TURN_JSON, p.body)
      local r = h:post("/worker/result", result_packet("t2", { ok = true, text = "x", files = {} }))
      assert.equal(409, r.status)
      assert.equal("No matching turn", r.body)
      r = h:post("/worker/result", result_packet("t1", { ok = true, text = "Hello", files = { { name = "a.txt", data = "aGk=" } } }))
      assert.equal(200, r.status)
      assert.equal("Accepted", r.body)
      async.wait(exec)
      assert.equal("Hello", res.text)
      assert.equal("a.txt", res.files[1].name)
    end)
  end)

  it("B44/B46: aborting a queued turn rejects it with cancelled; a result with no turn gets 409", function()
    h = harness.new {}
    run(function()
      local sig = signal.new()
      local t = async.spawn(function() return h.b:execute(TURN, sig) end)
      sig:abort("host")
      local ok, err = async.wait(t)
      assert.is_false(ok)
      assert.equal("Turn cancelled", err)
      assert.is_nil(h.b.pending)
      assert.equal(409, h:post("/worker/result", result_packet("t1", { ok = true, text = "x", files = {} })).status)
      -- a pending turn not delivered yet is refused before its body
      local t2 = async.spawn(function() return h.b:execute(TURN) end)
      assert.equal(409, h:post("/worker/result", result_packet("t1", { ok = true, text = "x", files = {} })).status)
      local ok2, err2 = pcall(h.b.execute, h.b, TURN)
      assert.is_false(ok2)
      assert.equal("Worker is busy", err2)
      assert.equal(200, h:get("/worker/next").status)
      assert.equal(200, h:post("/worker/result", result_packet("t1", { ok = false, error = "boom" })).status)
      local _, v = async.wait(t2)
      assert.same({ ok = false, error = "boom" }, v)
    end)
  end)

  it("B45: a second parked poll gets 429 Already waiting; an idle poll gets 408 Retry", function()
    h = harness.new { seams = { clock = fast_clock() } }
    run(function()
      local first = async.spawn(function() return h:get("/worker/next") end)
      harness.eventually(function() return h.b.poll ~= nil end)
      local second = h:get("/worker/next")
      assert.equal(429, second.status)
      assert.equal("Already waiting", second.body)
      local _, r = async.wait(first)
      assert.equal(408, r.status)
      assert.equal("Retry", r.body)
    end)
  end)

  it("B47/B48: a second packet while one is stalled gets 429; cancelling the turn fails the stalled one with 400", function()
    h = harness.new {}
    run(function()
      local sig = signal.new()
      local t = async.spawn(function() return h.b:execute(TURN, sig) end)
      assert.equal(200, h:get("/worker/next").status)
      local got
      local stalled = unix_request(h.sock, "POST /worker/result HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"turnId\":",
        { keep_open = true, timeout_ms = 20000 }, function(r) got = r end)
      harness.eventually(function() return h.b.receiving end)
      local second = h:post("/worker/result", result_packet("t1", { ok = true, text = "x", files = {} }))
      assert.equal(429, second.status)
      assert.equal("Already receiving", second.body)
      sig:abort("host")
      harness.eventually(function() return got ~= nil end)
      local r = peer.parse(got.data)
      assert.equal(400, r.status)
      assert.equal("Invalid result", r.body)
      assert.is_false(h.b.receiving)
      local ok, err = async.wait(t)
      assert.is_false(ok)
      assert.equal("Turn cancelled", err)
      stalled:close()
    end)
  end)

  it("B49: oversized text, too many files or a bad error type gets 400 Invalid result", function()
    h = harness.new {}
    run(function()
      local t = async.spawn(function() return h.b:execute(TURN) end)
      assert.equal(200, h:get("/worker/next").status)
      local files = {}
      for i = 1, 11 do files[i] = { name = "f" .. i, data = "aGk=" } end
      for _, res in ipairs {
        { ok = true, text = string.rep("é", 100001), files = {} },
        { ok = true, text = "x", files = files },
        { ok = true, text = "x", files = { { name = "../owner", data = "aGk=" } } },
        { ok = true, text = "x" },
        { ok = false, error = 5 },
        { ok = false, error = string.rep("e", 10001) },
      } do
        local r = h:post("/worker/result", result_packet("t1", res))
        assert.equal(400, r.status)
        assert.equal("Invalid result", r.body)
      end
      assert.equal(400, h:post("/worker/result", "{not json").status)
      assert.equal(409, h:post("/worker/result", '{"turnId":"t1","result":{"ok":"yes"}}').status)
      assert.equal(200, h:post("/worker/result", result_packet("t1", { ok = true, text = string.rep("é", 100000), files = {} })).status)
      async.wait(t)
    end)
  end)

  it("B50: /worker/config returns the compactor engine, or {} without one", function()
    h = harness.new {}
    run(function()
      local r = h:get("/worker/config")
      assert.equal(200, r.status)
      assert.equal("{}", r.body)
    end)
    h:stop()
    h = harness.new { over = { compaction = { engine = "my-compaction", compact = function() end } } }
    run(function() assert.equal('{"compaction":{"engine":"my-compaction"}}', h:get("/worker/config").body) end)
  end)

  it("B51: after a host restart the running worker's next ready reaches the new broker and its turns resume", function()
    h = harness.new {}
    run(function()
      local w = peer.worker(h.sock, { turn = function(t) return { ok = true, text = "seen " .. t.text, files = json.array() } end })
      harness.eventually(function() return h.b.ready end)
      assert.equal("seen hi", h.b:execute(TURN).text)
      h.b:stop()                                   -- the host process goes away
      os.remove(h.sock)
      local rich = require "sandbox.rich"
      local b2 = rich.broker { model = "m", oauthToken = function() return "k" end, logger = harness.logger({}) }
      assert(b2:listen(h.sock))
      harness.eventually(function() return b2.ready end, 10000)
      local t = { turnId = "t2", author = TURN.author, text = "again", images = {}, thinking = "low" }
      assert.equal("seen again", b2:execute(t).text)
      w.stop()
      b2:stop()
    end)
  end)
end)
