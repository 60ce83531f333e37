-- bench/warm_bench.lua: the figures of shared/spec/warm-turns.md 5, each a
-- ratio in one run against a bare sealed `docker run --rm` of a no-op static
-- binary with the same sealed argv (the baseline of bench/turn_bench.lua),
-- measured interleaved with the series:
--   * cold turn: admission to reply, instant scripted model on loopback,
--     warm turns off (target <= 1.0x);
--   * warm turn: the same with the channel's container already waiting,
--     for the CLI driver and the Engine API driver (target <= 0.1x), with
--     the phases of the turn record (admission -> stdin written, -> first
--     broker call, -> reply);
--   * 32 channels, one message each at once, every channel warm: p95 over
--     one bare run's p50 (target <= 1.0x);
--   * 32 channels at once, all cold: p95 and turns/s (reported);
--   * idle cost of one warm channel: this process's RSS, the waiting
--     container's cgroup memory, and (CLI driver) its `docker run` child.
-- Run as the sbx account: build/sbx lua bench/warm_bench.lua [TURNS]
local async = require "sandbox.async"
local core = require "sandbox.core"
local sandbox = require "sandbox"

local TURNS = tonumber(arg and arg[1]) or 20
local IMAGE = os.getenv("SBX_IMAGE") or "pi-roundtable-sandbox:local"
local WIDE = 32

package.path = "bench/?.lua;" .. package.path
local B = require "bench_lib"
local bare_baseline = require "bare_baseline"
local sh, q, summary, pct = B.sh, B.q, B.summary, B.pct

local function rss_kib(pid)
  local f = io.open("/proc/" .. (pid or "self") .. "/status")
  if not f then return 0 end
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s+(%d+)")) or 0
end

local root = B.private_root("warm_bench.lua", "wb")

local bare = bare_baseline.new(root)
local function bare_run() return bare:run() end

local server = B.instant_model()

local runtimes = {}
local function runtime(name, over)
  local o = {
    image = IMAGE, runRoot = root .. "/" .. name .. "/run", workspaceRoot = root .. "/" .. name .. "/work",
    model = "bench-model", modelUrl = server:url("/v1/chat/completions"),
    apiKey = function() return "bench-key" end, allowHttp = true, logLevel = "error",
  }
  for k, v in pairs(over or {}) do o[k] = v end
  local rt = sandbox.runtime(o)
  runtimes[#runtimes + 1] = rt
  local records = {}
  rt.recorder:subscribe(function(r) if r.kind == "turn" then records[#records + 1] = r end end)
  return rt, records
end

local cold = runtime("cold", { warm = { channels = 0 } })
local warm_cli, cli_records = runtime("warmcli", { warm = { channels = WIDE } })
local warm_engine, engine_records = runtime("warmengine",
  { warm = { channels = WIDE }, driver = require("sandbox.drivers.engine")() })


local SPEAKER = { id = "u", name = "User", principalId = "p-u" }
local function turn(rt, channel)
  local t0 = core.hrtime()
  local r = rt:run_turn(channel, SPEAKER, "hi")
  assert(r.ok and r.text == "done", "turn failed: " .. tostring(r.reason))
  return (core.hrtime() - t0) / 1e6
end

-- Until the channel's container waits (its start is not the turn's).
local function ready(rt, channel)
  local deadline = core.now() + 30000
  while core.now() < deadline do
    local e = rt.pool.entries[channel]
    if e and e.state == "ready" and not next(rt.pool.draining) then return e end
    async.sleep(10)
  end
  error("no warm container for " .. channel)
end

local function phases(records, from)
  local s, c, r = {}, {}, {}
  for i = from, #records do
    local t = records[i]
    if t.warm then
      s[#s + 1] = t.ms_start or 0
      c[#c + 1] = t.ms_first_call or 0
      r[#r + 1] = t.ms_reply or 0
    end
  end
  table.sort(s); table.sort(c); table.sort(r)
  return string.format("phases p50: stdin written %.1f ms, first broker call %.1f ms, reply %.1f ms (n=%d)",
    pct(s, 0.5) or 0, pct(c, 0.5) or 0, pct(r, 0.5) or 0, #s)
end

-- n channels at once (each ready first when warm); latencies and wall ms.
local function wide(rt, prefix, warm)
  if warm then
    for i = 1, WIDE do turn(rt, prefix .. i) end
    for i = 1, WIDE do ready(rt, prefix .. i) end
  end
  local tasks, t0 = {}, core.hrtime()
  for i = 1, WIDE do tasks[i] = async.spawn(turn, rt, prefix .. i) end
  local ms = {}
  for i = 1, WIDE do
    local okw, v = async.wait(tasks[i])
    assert(okw, v)
    ms[i] = v
  end
  return ms, (core.hrtime() - t0) / 1e6
end

local ok, err = pcall(async.run, function()
  print(string.format("image %s; %d turns per series and %d bare runs, interleaved; machine: %s cores",
    IMAGE, TURNS, TURNS, sh("nproc")))
  turn(cold, "bench:c"); turn(warm_cli, "bench:w"); turn(warm_engine, "bench:w"); bare_run()   -- caches
  local bare, c, wc, we = {}, {}, {}, {}
  local cli_from, engine_from = #cli_records + 1, #engine_records + 1
  for i = 1, TURNS do
    bare[i] = bare_run()
    c[i] = turn(cold, "bench:c")
    ready(warm_cli, "bench:w")
    wc[i] = turn(warm_cli, "bench:w")
    ready(warm_engine, "bench:w")
    we[i] = turn(warm_engine, "bench:w")
  end
  local b = summary("bare docker run --rm (no-op)", bare)
  local sc = summary("cold turn (warm off)", c)
  local swc = summary("warm turn, CLI driver", wc)
  local swe = summary("warm turn, Engine API driver", we)
  print(string.format("cold / bare   p50 %.2fx  p95 %.2fx   (target <= 1.0x)", sc.p50 / b.p50, sc.p95 / b.p95))
  print(string.format("warm CLI / bare    p50 %.2fx  p95 %.2fx   (target <= 0.1x)", swc.p50 / b.p50, swc.p95 / b.p95))
  print("  CLI " .. phases(cli_records, cli_from))
  print(string.format("warm Engine / bare p50 %.2fx  p95 %.2fx   (target <= 0.1x)", swe.p50 / b.p50, swe.p95 / b.p95))
  print("  Engine " .. phases(engine_records, engine_from))

  -- idle cost of one warm channel (the Engine runtime holds bench:w's)
  local e = ready(warm_cli, "bench:w")
  local mem = sh("docker stats --no-stream --format '{{.MemUsage}}' " .. q(e.name))
  local child = e.h and e.h.proc and rss_kib(e.h.proc:pid()) or 0
  collectgarbage(); collectgarbage()
  local with = rss_kib()
  warm_cli:cool("bench:w")
  async.sleep(1500)
  collectgarbage(); collectgarbage()
  local without = rss_kib()
  print(string.format("idle warm channel: engine RSS %+.1f MiB; container memory %s; CLI attach child %.1f MiB",
    (with - without) / 1024, mem, child / 1024))

  for _, s in ipairs {
    { "32 warm channels at once, CLI", warm_cli, "wc:", true },
    { "32 warm channels at once, Engine", warm_engine, "we:", true },
    { "32 cold channels at once", cold, "cc:", false },
  } do
    local ms, wall = wide(s[2], s[3], s[4])
    local r = summary(s[1], ms, 36)
    print(string.format("  p95 / bare p50 %.2fx   %.1f turns/s", r.p95 / b.p50, WIDE / (wall / 1000)))
  end
end)
pcall(async.run, function()
  for _, rt in ipairs(runtimes) do rt:dispose() end
end)
server:close()
bare:remove()
os.execute("rm -rf " .. q(root))
if not ok then error(err, 0) end
