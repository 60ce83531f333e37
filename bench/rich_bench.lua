-- bench/rich_bench.lua: what the host adds to one rich-mode turn, against the
-- same turn's model time, in one run (spec/rich-mode.md; issue 15 item 7).
--
--   runuser -u sbx -- build/sbx lua bench/rich_bench.lua [N] [--docker]
--
-- The upstream is the scripted Anthropic SSE fixture answering at once
-- (spec/fixtures/anthropic_sse_upstream.mjs), reached through fetchImpl and
-- the built-in libcurl transport. The worker is either a Lua peer speaking
-- section 10 over the channel's real broker socket (default: one streamed
-- model call per turn) or, with --docker, the real Pi container of `make
-- image-pi` behind the built-in Docker driver. Per turn (the broker's trace
-- seam gives the call and hand-over times):
--   turn      runTurn from admission to its reply
--   worker    from the turn handed out on /worker/next to its result accepted
--   model     the broker's model calls of the turn (admission to the last byte)
--   upstream  the same calls' transport time (request to the end of the body)
--   host      turn - worker + (model - upstream): the runtime's bookkeeping
--             (judge, start check, bind, queue, hand-over, result checks) and
--             the broker's own share of every model call (rebuild, credential,
--             filters, streaming)
-- and prints min / p50 / p90 in milliseconds and host/model at p50.
package.path = "lua/?.lua;lua/?/init.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/lua/?.so;" .. package.cpath

local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local fixture = require "rich_fixture_driver"
local peer = require "rich_peer"
local rich = require "sandbox.rich"
local upstream = require "anthropic_upstream"

local N = tonumber(arg[1] or "20")
local DOCKER = arg[2] == "--docker" or arg[1] == "--docker"
if arg[1] == "--docker" then N = 20 end

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return (out:gsub("%s+$", ""))
end

local root = core.realpath(sh("mktemp -d /tmp/rich-bench-XXXXXX"))
local up = upstream.start()
local records, upstream_ms = {}, {}
local curl = rich.transport()

local function timed_fetch(req)
  local t0 = core.hrtime()
  local url = req.url:gsub("^https://api%.anthropic%.com", up.url)
  local res = curl { method = req.method, url = url, headers = req.headers, body = req.body, signal = req.signal }
  local body = res.body
  res.body = function()
    local chunk = body()
    if chunk == nil then upstream_ms[#upstream_ms + 1] = (core.hrtime() - t0) / 1e6 end
    return chunk
  end
  return res
end

local driver
if DOCKER then
  driver = rich.dockerDriver { log = { driver = "local" } }
else
  driver = fixture.new { turn = function(t, _, w)
    local body = json.encode(json.jsonable({ stream = true, max_tokens = 100, messages = { { role = "user", content = t.text } } }))
    local r = peer.request(w.sock, "POST", "/anthropic/v1/messages?beta=true", body)
    return { ok = r.status == 200, text = r.status == 200 and "ok" or nil, error = r.status ~= 200 and tostring(r.status) or nil,
      files = json.array() }
  end }
end

local channel = "bench:rich-" .. core.getpid()
local rt = rich({
  partyDir = root .. "/p", image = os.getenv("PI_IMAGE") or "pi-roundtable-sandbox:pi",
  profiles = { bench = { model = "claude-sonnet-4-6" } },
  oauthToken = function() return "bench-host-token" end,
  effort = { judge = function() return "low" end },
  driver = driver, fetchImpl = timed_fetch, startTimeoutMs = 120000, turnTimeoutMs = 300000,
  logger = { info = function() end, warn = function() end, error = function(m, f) io.stderr:write(m, " ", tostring(f.message), "\n") end },
}, {
  -- a sub-millisecond clock for the trace records (timers keep core.timer)
  clock = { now = function() return core.hrtime() / 1e6 end, timer = core.timer },
  trace = function(r) records[#records + 1] = r end,
})

local function pct(list, p)
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  table.sort(s)
  return s[math.max(1, math.ceil(#s * p))]
end

local rows = { turn = {}, worker = {}, model = {}, upstream = {}, host = {} }
local ok, err = pcall(async.run, function()
  rt:start(channel, "bench")
  for i = 0, N do
    records, upstream_ms = {}, {}
    local t0 = core.hrtime()
    local r = rt:runTurn { channel = channel, profile = "bench", turnId = "t" .. i,
      author = { id = "1", name = "Bench" }, text = "turn " .. i, images = {} }
    local turn = (core.hrtime() - t0) / 1e6
    assert(r.ok, r.error)
    local delivered, result, model = nil, nil, 0
    for _, rec in ipairs(records) do
      if rec.event == "delivered" then delivered = rec.at end
      if rec.event == "result" then result = rec.at end
      if rec.route == "model" then model = model + rec.ms end
    end
    local up_total = 0
    for _, v in ipairs(upstream_ms) do up_total = up_total + v end
    if i > 0 then                                  -- turn 0 warms up
      local worker = result - delivered
      rows.turn[#rows.turn + 1] = turn
      rows.worker[#rows.worker + 1] = worker
      rows.model[#rows.model + 1] = model
      rows.upstream[#rows.upstream + 1] = up_total
      rows.host[#rows.host + 1] = turn - worker + (model - up_total)
    end
  end
  rt:stop(channel)
  rt:stopBrokers()
end)
up:stop()
os.execute("rm -rf '" .. root .. "'")
if not ok then error(err, 0) end

print(string.format("rich turn, %s worker, %d turns (ms)", DOCKER and "real Pi container" or "Lua peer", N))
for _, k in ipairs { "turn", "worker", "model", "upstream", "host" } do
  print(string.format("  %-8s min %8.2f  p50 %8.2f  p90 %8.2f", k, pct(rows[k], 0), pct(rows[k], 0.5), pct(rows[k], 0.9)))
end
print(string.format("  host / model at p50: %.2fx", pct(rows.host, 0.5) / pct(rows.model, 0.5)))
