-- bench/metrics_bench.lua: what the metrics (spec/operations.md 4,
-- lua/sandbox/ops/metrics.lua) cost a turn. Two runtimes in one process,
-- each on its own roots, run the same turn interleaved: the real runtime,
-- the real broker on the turn's socket, the real worker Lua on the host
-- (spec/support/worker_harness.lua's driver, no container, so the fixed
-- cost of Docker does not hide the difference) and a loopback model that
-- asks for one host tool, then answers: two /model calls and one /tools
-- call per turn. "with" is the runtime as built; "without" is the same
-- runtime with the metrics reader taken off its recorder (the second
-- reader runtime/init.lua subscribes), so nothing but the metrics differs.
-- Also times one render of the exposition (what a scrape costs the loop).
-- Run as the service account from the repository root (make bench does):
--
--   runuser -u sbx -- build/sbx lua bench/metrics_bench.lua [TURNS]
package.path = "spec/support/?.lua;bench/?.lua;" .. package.path
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local sandbox = require "sandbox"
local B = require "bench_lib"
local W = require "worker_harness"

local TURNS = tonumber(arg and arg[1]) or 200
local SPEAKER = { id = "guest", name = "Guest", principalId = "p_guest" }
assert(W.available(), "build/worker/sbxw.so is missing: make")

local function message(m)
  return json.encode(json.object({ "choices" }, { choices = json.array {
    json.object({ "index", "message", "finish_reason" }, { index = 0, message = m, finish_reason = "stop" }) } }))
end
local ASK = message(json.object({ "role", "content", "tool_calls" }, { role = "assistant", content = json.null,
  tool_calls = json.array { json.object({ "id", "type", "function" }, { id = "c1", type = "function",
    ["function"] = json.object({ "name", "arguments" }, { name = "host_clock", arguments = "{}" }) }) } }))
local ANSWER = message(json.object({ "role", "content" }, { role = "assistant", content = "It is noon." }))

-- The model: a tool result in the request means "answer", else "ask".
local model = assert(core.http_server { on_request = function(req)
  req:reply(200, req.body:find('"role":"tool"', 1, true) and ANSWER or ASK)
end })

local dirs = {}
local function runtime()
  local dir = B.sh("mktemp -d /tmp/sbx-mb-XXXXXX")
  os.execute("chmod 700 " .. B.q(dir))
  dirs[#dirs + 1] = dir
  return sandbox.runtime {
    image = "pi-roundtable-sandbox:local", runRoot = dir .. "/run", workspaceRoot = dir .. "/work",
    model = "bench-model", modelUrl = model:url("/v1/chat/completions"), allowHttp = true,
    apiKey = function() return "bench-key" end, driver = W.driver(), logLevel = "error", audit = false,
    tools = { { name = "clock", description = "The time.", parameters = { type = "object" },
      run = function() return "12:00" end } },
  }
end

local with, without = runtime(), runtime()
assert(#without.recorder.readers == 2, "runtime/init.lua subscribes the log's reader, then the metrics'")
table.remove(without.recorder.readers, 2)

local samples = { with = {}, without = {} }
async.run(function()
  local function one(rt, list, i)
    local t0 = core.hrtime()
    local r = rt:run_turn("bench:" .. (i % 8), SPEAKER, "What time is it?")
    list[#list + 1] = (core.hrtime() - t0) / 1e6
    assert(r.ok, r.reason)
  end
  for i = 1, 10 do one(with, {}, i) one(without, {}, i) end          -- warm-up
  for i = 1, TURNS do
    if i % 2 == 0 then one(with, samples.with, i) one(without, samples.without, i)
    else one(without, samples.without, i) one(with, samples.with, i) end
  end
end)

local a = B.summary("turn without metrics", samples.without)
local b = B.summary("turn with metrics", samples.with)
print(string.format("ratio with/without   p50 %.3fx   p95 %.3fx", b.p50 / a.p50, b.p95 / a.p95))

local renders = {}
local text
for _ = 1, 200 do
  local t0 = core.hrtime()
  text = with:metrics()
  renders[#renders + 1] = (core.hrtime() - t0) / 1e6
end
table.sort(renders)
print(string.format("one render (%d bytes, %d turns counted)   p50 %.3f ms   p95 %.3f ms", #text,
  math.tointeger(tonumber(text:match('\nsbx_turns_total{reason="ok"} (%d+)'))) or -1, B.pct(renders, 0.5), B.pct(renders, 0.95)))

async.run(function() with:dispose() without:dispose() end)
model:close()
for _, d in ipairs(dirs) do os.execute("rm -rf " .. B.q(d)) end
