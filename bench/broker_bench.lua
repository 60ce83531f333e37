-- bench/broker_bench.lua: broker round trip of POST /tools/<name> for a
-- trivial Lua tool over the real Unix socket, against a bare echo over the
-- same libuv listener (the test_echo seam: replies from C right after step
-- 12, no Lua) measured in the same run. Client and server share one loop, so
-- the figures are for one core. The client is the specs' raw Unix client
-- (spec/support/unix_request.lua). Run from the repository root:
-- build/sbx lua bench/broker_bench.lua [CALLS]
local async = require "sandbox.async"
local core = require "sandbox.core"
local sandbox = require "sandbox"
local unix_request = dofile("spec/support/unix_request.lua")

local CALLS = tonumber(arg and arg[1]) or 5000
local BATCH = 1000                  -- the broker's budget ceiling per turn
local BODY = '{"text":"hello"}'
local REQUEST = "POST %s HTTP/1.1\r\nHost: broker\r\nContent-Type: application/json\r\n" ..
  "Authorization: Bearer sandbox-dummy-key\r\nContent-Length: " .. #BODY .. "\r\n\r\n" .. BODY

local dir = io.popen("mktemp -d /tmp/sbx-bench-XXXXXX"):read("l")
os.execute("chmod 700 " .. dir)
local path = dir .. "/b.sock"

local function call(route)
  local t0 = core.hrtime()
  local res = async.await(function(resume)
    unix_request(path, REQUEST:format(route), { timeout_ms = 10000 }, resume)
  end)
  assert(res.ok and res.data:find("^HTTP/1.1 200 "), "call failed")
  return core.hrtime() - t0
end

local function percentile(sorted, p)
  return sorted[math.max(1, math.ceil(#sorted * p))]
end

-- start(): returns a stop function; called before each batch of BATCH calls.
-- stop() runs inside the task, so it lets the loop turn with async.sleep(0):
-- core.run there would re-enter the running loop (refused by core/loop.c).
local function measure(name, route, start)
  local samples = {}
  local t_all = core.hrtime()
  local done = 0
  while done < CALLS do
    local stop = start()
    for _ = 1, math.min(BATCH, CALLS - done) do
      samples[#samples + 1] = call(route)
      done = done + 1
    end
    stop()
  end
  local elapsed = (core.hrtime() - t_all) / 1e9
  table.sort(samples)
  local r = { name = name, p50 = percentile(samples, 0.50) / 1e3, p99 = percentile(samples, 0.99) / 1e3,
              rate = CALLS / elapsed }
  print(string.format("%-22s p50 %8.1f us   p99 %8.1f us   %8.0f calls/s", name, r.p50, r.p99, r.rate))
  return r
end

local function echo_listener()
  local l = assert(core.broker_listen { path = path, routes = { "/echo" }, max_calls = BATCH, test_echo = true,
                                       on_call = function() end })
  return function() l:stop(); async.sleep(0) end
end

local cfg = sandbox {
  model = "bench-model", modelUrl = "https://models.example/v1/chat/completions",
  apiKey = function() return "bench-key" end,
  tools = { { name = "echo", description = "echo", parameters = { type = "object" },
              run = function(input) return input.text end } },
}

local function tool_broker()
  local o = cfg.options
  local b = sandbox.broker { model = o.model, modelUrl = o.modelUrl, apiKey = o.apiKey, tools = o.tools,
    maxCalls = BATCH, channel = "bench:one", speaker = { id = "u", name = "u", principalId = "p-u" } }
  assert(b:start(path))
  return function() b:end_turn(); b:stop(); async.sleep(0) end
end

async.run(function()
  print(string.format("calls: %d per case, one connection per call, client and server on one loop", CALLS))
  measure("warm-up", "/echo", echo_listener)
  local echo = measure("bare echo (C)", "/echo", echo_listener)
  local tool = measure("broker /tools/echo", "/tools/echo", tool_broker)
  print(string.format("ratio p50 %.2fx   p99 %.2fx   throughput %.2fx (target: within 3x)",
    tool.p50 / echo.p50, tool.p99 / echo.p99, echo.rate / tool.rate))
end)
os.execute("rm -rf " .. dir)
