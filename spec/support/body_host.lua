-- body_host.lua: a host process of rich brokers whose peak memory is measured
-- while another process sends them hostile bodies (issue 21 item 2), for
-- spec/rich/hostile_bodies_spec.lua and bench/body_memory_bench.lua.
--
--   lua5.4 spec/support/body_host.lua DIR KIND...
--
-- Run with LUA_PATH / LUA_CPATH naming the tree under test (this checkout, or
-- another one for a before/after figure). One broker per KIND, listening on
-- DIR/<i>.sock with a turn bound (channel c<i>):
--   result     the turn (turnId t<i>) is queued: GET /worker/next hands it out,
--              then the packet under test is POSTed; its outcome is reported
--   model      a model call goes to a fetchImpl answering 200 {} at once
--   compact    a host compactor is configured (maxRequestBytes: BODY_HOST_COMPACT_MAX)
--   bystander  a worker in this process serves turn after turn, each making
--              one model call, until the end: every turn must succeed
--   sealed, precheck   core.broker_listen (the sealed / precheck policy, its
--              body limit) with one route, /model, answering 200 {}
-- Once listening it collects garbage, resets the peak (/proc/self/clear_refs)
-- and writes DIR/ready ({rss_kb}). When DIR/done appears it writes DIR/report
-- ({rss0_kb, hwm_kb, bystander = {ok, failed}, results = {[i] = outcome}}) and
-- exits.
package.path = (os.getenv("BODY_HOST_SUPPORT") or "spec/support") .. "/?.lua;" .. package.path
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local peer = require "rich_peer"
local rich = require "sandbox.rich"

local dir = assert(arg[1], "usage: body_host.lua DIR KIND...")
local kinds = { table.unpack(arg, 2) }

local function status_kb(field)
  for l in io.lines("/proc/self/status") do
    local v = l:match("^" .. field .. ":%s*(%d+)")
    if v then return tonumber(v) end
  end
end

local function write(path, s)
  local f = assert(io.open(path .. ".tmp", "w"))
  f:write(s)
  f:close()
  assert(os.rename(path .. ".tmp", path))
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

local function fetch_impl()
  return { status = 200, headers = { ["content-type"] = "application/json" }, body = '{"id":"msg","content":[]}' }
end

local function compactor(req)
  return { summary = "s", firstKeptEntryId = req.firstKeptEntryId, tokensBefore = 1 }
end

local TURN = { author = { id = "1", name = "A", principalId = "a" }, text = "hi", memory = "",
  memoryVisibility = "private", images = {}, thinking = "high" }

local function turn(id)
  local t = {}
  for k, v in pairs(TURN) do t[k] = v end
  t.turnId = id
  return t
end

local brokers, results, stopping = {}, {}, false
local by = { ok = 0, failed = 0 }

async.run(function()
  for i, kind in ipairs(kinds) do
    local opts = { model = "claude-sonnet-4-6", oauthToken = function() return "sk-ant-oat01-bench" end,
      fetchImpl = fetch_impl, turnTimeoutMs = 600000 }
    if kind == "compact" then
      opts.compaction = { engine = "bench", compact = compactor,
        maxRequestBytes = tonumber(os.getenv("BODY_HOST_COMPACT_MAX") or "") }
    end
    local sock = dir .. "/" .. i .. ".sock"
    if kind == "sealed" or kind == "precheck" then
      -- The C listener of the sealed and precheck brokers (it judges and
      -- decodes the body itself, then hands the value to Lua).
      local l = assert(core.broker_listen { path = sock, routes = { "/model" }, max_calls = 1000, policy = kind == "precheck" and "precheck" or "broker",
        max_body = kind == "precheck" and 65536 or nil, on_call = function(call) call:reply(200, "{}") end })
      brokers[i] = { stop = function() l:stop() end }
      goto next
    end
    local b = rich.broker(opts)
    assert(b:listen(sock))
    brokers[i] = b
    if kind == "bystander" then
      async.spawn(function()
        local w = peer.worker(sock, { ready = '{"capabilities":{"privateTo":true,"readerRecords":true}}',
          turn = function()
            local r = peer.request(sock, "POST", "/anthropic/v1/messages",
              '{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}')
            return { ok = r.status == 200, text = "model " .. tostring(r.status), error = "model " .. tostring(r.status), files = json.array() }
          end })
        local n = 0
        while not stopping do
          n = n + 1
          local release = b:bind { channel = "c" .. i, profile = "main", speaker = TURN.author, thinking = "high",
            signal = require("sandbox.signal").new() }
          local ok, res = pcall(b.execute, b, turn("b" .. n))
          release()
          if ok and res.ok then by.ok = by.ok + 1 else by.failed = by.failed + 1 end
          async.sleep(20)
        end
        w.stop()
      end)
    else
      b:bind { channel = "c" .. i, profile = "main", speaker = TURN.author, thinking = "high",
        signal = require("sandbox.signal").new() }
      if kind == "result" then
        results[i] = "pending"
        async.spawn(function()
          local ok, res = pcall(b.execute, b, turn("t" .. i))
          results[i] = ok and (res.ok and "ok" or "failed") or ("error: " .. tostring(res))
        end)
      end
    end
    ::next::
  end
  collectgarbage()
  collectgarbage()
  local f = io.open("/proc/self/clear_refs", "w")
  if f then f:write("5") f:close() end
  local rss0 = status_kb("VmRSS")
  write(dir .. "/ready", json.encode({ rss_kb = rss0 }))
  while not exists(dir .. "/done") do async.sleep(50) end
  stopping = true
  async.sleep(100)
  local hwm = status_kb("VmHWM")
  local res = {}
  for i = 1, #kinds do res[i] = results[i] or json.null end
  write(dir .. "/report", json.encode(json.jsonable({ rss0_kb = rss0, hwm_kb = hwm, bystander = by, results = json.array(res) })))
  for _, b in ipairs(brokers) do b.stop(b) end
end)
os.exit(0)
