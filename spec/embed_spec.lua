-- embed_spec.lua: the Lua side of the embedding ABI (lua/sandbox/embed/init.lua
-- and the utility requests of embed/_utilities.lua, embed/_research.lua),
-- driven in this process with the four closures core/ffi.c hands it, so
-- request and result shapes are visible without the engine thread
-- (the C driver of the ABI drives the same module through core/ffi.c,
-- bun/test through Bun). The config returns a duck-typed app (the methods of
-- lua/sandbox/app.lua, no runtime), so only the engine is under test.
local async = require "sandbox.async"
local embed = require "sandbox.embed"
local json = require "sandbox.json"
local spec_fs = require "spec_fs"

-- The duck-typed app: echoes, asks host.apiKey on "key", raises on "raise";
-- typing is started and stopped around every answer.
local APP = [[
local app = { options = {}, services = {} }
function app:start(host) self.host = host return self end
function app:claim(event, admission)
  if event.channelId ~= "1" then return { claim = false, priority = 200 } end
  return { claim = true, priority = 200, action = admission and "answer" or "drop" }
end
function app:handle(event, admission)
  local stop_typing = self.host.typing(event)
  local text = event.text
  if text == "raise" then stop_typing() error("fake turn exploded", 0) end
  local reply = "echo: " .. text
  if text == "key" then
    reply = "key=" .. tostring(self.host.apiKey({ channel = "discord:" .. event.channelId,
      speaker = { id = event.author.id, name = event.author.name, principalId = admission.principalId } }))
  end
  stop_typing()
  return { replies = { reply } }
end
function app:command() return { replies = { "ok" }, ephemeral = true } end
function app:status() return { started = true } end
function app:dispose() end
return app
]]

local dir = spec_fs.tmpdir("sbx-spec")
local FAKE_APP = dir .. "/app.lua"
spec_fs.write(FAKE_APP, APP)
teardown(function() spec_fs.rmdir(dir, "sbx-spec") end)

-- An engine whose outputs are collected in h.out ({rid, text, final, v}).
local function engine(path, options_json)
  local h = { out = {} }
  h.e = embed.new(path, options_json, {
    emit = function(rid, text, final)
      h.out[#h.out + 1] = { rid = rid, text = text, final = final, v = json.decode(text) }
    end,
    ready = function(err) h.ready = err or false end,
    done = function() h.done = true end,
    counters = function() return 2, 0, 1 end,
  })
  return h
end

local function find(h, pred)
  for _, o in ipairs(h.out) do if pred(o) then return o end end
end

local function final_of(h, rid)
  return find(h, function(o) return o.final and o.rid == rid end)
end

-- Inside a task: submit one request and wait for its final result.
local function call(h, rid, req)
  h.e:dispatch(rid, type(req) == "string" and req or assert(json.encode(req)))
  spec_fs.wait_for(function() return final_of(h, rid) ~= nil end, "result " .. rid)
  return final_of(h, rid)
end

local function stop(h)
  h.e:stop()
  spec_fs.wait_for(function() return h.done end, "engine done")
end

describe("a utility engine (no config script)", function()
  it("answers ping and status, and refuses what only an app serves", function()
    local h = engine(nil, nil)
    assert.is_false(h.ready)
    async.run(function()
      assert.equal('{"type":"result","request":1,"ok":true,"value":true}', call(h, 1, '{"type":"ping"}').text)
      local st = call(h, 2, { type = "status" }).v.value.engine
      assert.same({ 1, 1, 2, 1, 0, false }, { st.abi, st.pending, st.submitted, st.queued, st.dropped, st.stopping })
      assert.equal("this engine has no app: it was created without a config script",
        call(h, 3, '{"type":"claim","event":{}}').v.error)
      assert.equal("invalid request: unknown type: nope", call(h, 4, '{"type":"nope"}').v.error)
      assert.equal("invalid request: not a JSON object", call(h, 5, "[1]").v.error)
      assert.is_false(call(h, 6, "{").v.ok)
      stop(h)
    end)
  end)

  it("serves the host facilities: isPublicAddress and scrubDiagnostic", function()
    local h = engine("", nil)
    async.run(function()
      assert.is_true(call(h, 1, { type = "isPublicAddress", text = "93.184.216.34" }).v.value)
      assert.is_false(call(h, 2, { type = "isPublicAddress", text = "127.0.0.1" }).v.value)
      local v = call(h, 3, { type = "scrubDiagnostic", text = "Bearer sk-secret-123456 failed", max = 200 }).v
      assert.is_true(v.ok)
      assert.is_nil(v.value:find("sk-secret-123456", 1, true))
      stop(h)
    end)
  end)
end)

describe("an engine with a config script", function()
  it("refuses options_json that is not an object or has a bad apiKey mode", function()
    for _, bad in ipairs { "[]", '{"apiKey":"literal"}', '{"host":1}', "{" } do
      assert.has_error(function() engine(FAKE_APP, bad) end)
    end
  end)

  it("runs a message: claim event, typing events with the request id, then one final result", function()
    local h = engine(FAKE_APP, '{"host":{"rootCommand":"rt"}}')
    async.run(function()
      spec_fs.wait_for(function() return h.ready ~= nil end, "ready")
      assert.is_false(h.ready)
      local msg = { type = "message", event = { channelId = "1", text = "hi", author = { id = "a" } },
        admission = { tier = "member", principalId = "p" } }
      local res = call(h, 7, msg)
      assert.same({ claim = { claim = true, priority = 200, action = "answer" }, result = { replies = { "echo: hi" } } },
        json.plain(res.v.value))
      local events = {}
      for _, o in ipairs(h.out) do
        if not o.final then events[#events + 1] = o.text end
      end
      assert.same({
        '{"type":"event","request":7,"name":"claim","claim":{"action":"answer","claim":true,"priority":200}}',
        '{"type":"event","request":7,"name":"typing","on":true}',
        '{"type":"event","request":7,"name":"typing","on":false}',
      }, events)
      stop(h)
    end)
  end)

  it("asks the embedding process for a host apiKey and uses its answer", function()
    local h = engine(FAKE_APP, '{"apiKey":"host"}')
    async.run(function()
      spec_fs.wait_for(function() return h.ready ~= nil end, "ready")
      h.e:dispatch(1, assert(json.encode { type = "message",
        event = { channelId = "1", text = "key", author = { id = "a", name = "A" } },
        admission = { tier = "member", principalId = "p_a" } }))
      spec_fs.wait_for(function() return find(h, function(o) return o.v.type == "apiKey.request" end) end, "key request")
      local ask = find(h, function(o) return o.v.type == "apiKey.request" end)
      assert.equal('{"type":"apiKey.request","request":0,"id":1,"scope":{"channel":"discord:1",'
        .. '"speaker":{"id":"a","name":"A","principalId":"p_a"}}}', ask.text)
      assert.is_true(call(h, 2, { type = "apiKey.result", id = 1, key = "k-1" }).v.value)
      spec_fs.wait_for(function() return final_of(h, 1) end, "message result")
      assert.same({ "key=k-1" }, json.plain(final_of(h, 1).v.value.result).replies)
      stop(h)
    end)
  end)

  it("a raising handler is an ok=false result; stop fails what still waits with `engine stopped`", function()
    local h = engine(FAKE_APP, nil)
    async.run(function()
      spec_fs.wait_for(function() return h.ready ~= nil end, "ready")
      local raise = { type = "message", event = { channelId = "1", text = "raise", author = { id = "a" } },
        admission = { tier = "member", principalId = "p" } }
      assert.equal("fake turn exploded", call(h, 1, raise).v.error)
      stop(h)
      assert.equal("engine stopped", call(h, 2, '{"type":"ping"}').v.error)
    end)
  end)
end)

describe("error_parts", function()
  it("gives a structured error its errorInfo (name, message, code, status, headers in order)", function()
    local msg, info = embed.error_parts({ name = "UnsafeUrlError", message = "Port 0 is not allowed",
      code = "E_PORT", status = 403, headers = { b = "2", a = "1" }, extra = "dropped" })
    assert.equal("Port 0 is not allowed", msg)
    assert.equal('{"name":"UnsafeUrlError","message":"Port 0 is not allowed","code":"E_PORT","status":403,'
      .. '"headers":{"a":"1","b":"2"}}', json.encode(info))
    assert.same({ "boom" }, { embed.error_parts("boom") })
  end)
end)
