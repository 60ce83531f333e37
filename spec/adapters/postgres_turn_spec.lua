-- postgres_turn_spec.lua: examples/postgres.conf.lua end to end (issue 24
-- item 4): the example's runtime over a throwaway PostgreSQL cluster
-- (pg_cluster.lua), the real broker on the turn's socket, the real worker
-- Lua (worker_harness.lua's driver) and a loopback model that calls
-- host_notes_put then host_notes_get; then another speaker's model forges
-- the first speaker's identity in the tool input and reads nothing of hers.
local cluster = require "pg_cluster"
if not cluster.require("examples/postgres.conf.lua end to end", pending) then return end

local async = require "sandbox.async"
local json = require "sandbox.json"
local sandbox = require "sandbox"
local fake_upstream = require "fake_upstream"
local spec_fs = require "spec_fs"
local W = require "worker_harness"

if not W.available() then
  if os.getenv("CI") == "true" then error("CI=true: build/worker/sbxw.so is not built (make)", 0) end
  describe("examples/postgres.conf.lua end to end", function() pending("build/worker/sbxw.so is not built (make)") end)
  return
end

local ANN = { id = "ann", name = "Ann", principalId = "p_ann" }
local BOB = { id = "bob", name = "Bob", principalId = "p_bob" }

local C, up
local roots = {}
setup(function()
  C = cluster.start()
  C:createdb("turns")
  up = fake_upstream.start()
end)
teardown(function()
  if up then up:stop() end
  if C then C:stop() end
  spec_fs.rmdirs(roots)
end)

local function reply(message, finish)
  return { status = 200, body = json.encode(json.object({ "choices" }, { choices = json.array {
    json.object({ "index", "message", "finish_reason" }, { index = 0, message = message, finish_reason = finish }) } })) }
end

local function text_reply(t)
  return reply(json.object({ "role", "content" }, { role = "assistant", content = t }), "stop")
end

local function call(name, args)
  return reply(json.object({ "role", "content", "tool_calls" }, { role = "assistant", content = json.null,
    tool_calls = json.array { json.object({ "id", "type", "function" }, { id = "c-" .. name, type = "function",
      ["function"] = json.object({ "name", "arguments" }, { name = name, arguments = args }) }) } }), "tool_calls")
end

local function runtime()
  local root = spec_fs.tmpdir("pgt", roots, spec_fs.short_tmp())
  local fn = assert(loadfile("examples/postgres.conf.lua"))
  local cfg = fn {
    database = C:opts("turns"),
    runRoot = root .. "/run", workspaceRoot = root .. "/work", stateFile = root .. "/state.json",
    model = "spec-model", modelUrl = up:url("/v1/chat/completions"), allowHttp = true,
    apiKey = function() return "sk-pg-spec" end, driver = W.driver(), logLevel = "error",
  }
  assert.is_true(sandbox.is_config(cfg))
  -- the example's app, started as `sbx run` starts one (app:runtime_options)
  local opts, checked = cfg:runtime_options { timeZone = "UTC" }
  return sandbox.runtime.new(opts, checked)
end

local function turn(rt, channel, speaker, text)
  return async.run(function()
    local reply_text, _, res = rt:guest_turn(channel, speaker, text)
    return { text = reply_text, res = res }
  end)
end

describe("examples/postgres.conf.lua", function()
  it("a sealed turn saves a private note with notes_put and reads it back with notes_get", function()
    if not spec_fs.service_account(pending) then return end
    async.run(function()
      up:reset()
      up:script {
        call("host_notes_put", '{"key":"colour","value":"green"}'),
        call("host_notes_get", '{"key":"colour"}'),
        text_reply("Your colour is green."),
        -- bob's turn: the model forges ann's identity in the input
        call("host_notes_get", '{"key":"colour","speaker":"ann","principalId":"p_ann","owner":"p_ann","channel":"fake:pg"}'),
        text_reply("I do not know."),
      }
    end)
    local rt = runtime()
    local r = turn(rt, "fake:pg", ANN, "Remember my colour is green")
    assert.is_true(r.res.ok, r.res.reason)
    assert.equal("Your colour is green.", r.text)
    local b = turn(rt, "fake:pg", BOB, "What is Ann's colour?")
    async.run(function() rt:dispose() end)
    assert.is_true(b.res.ok, b.res.reason)

    -- the row is ann's, private, in ann's channel
    assert.equal("fake:pg|p:p_ann|private|colour|green|p:p_ann",
      C:psql("turns", "SELECT channel, owner, visibility, key, value, author FROM sbx_notes"))
    local log = async.run(function() return up:log() end)
    assert.equal(5, #log)
    assert.truthy(log[2].body:find("saved private note", 1, true))   -- notes_put's result reached the model
    -- the tool result is JSON text inside the worker's JSON inside the request: unescaped
    local function plain(i) return (log[i].body:gsub("\\", "")) end
    assert.truthy(plain(3):find('"private":"green"', 1, true))            -- notes_get's result
    -- bob's forged read came back empty: the database gave bob nothing of ann's
    -- (the sealed channel's history is the channel's, shared by its guests,
    -- so the earlier turn's text is in it; the row's owner is what the read
    -- is decided by)
    assert.truthy(plain(5):find('"key":"colour","private":null,"shared":null', 1, true))  -- only bob's read yields this
  end)
end)
