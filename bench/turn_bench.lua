-- bench/turn_bench.lua: the sealed turn's overhead (issue 3).
--   * turn: rt:run_turn with an instant scripted model on loopback, from
--     admission to reply: turn dir, broker, container create/start, the
--     worker's model call through the broker, reply, removal, cleanup;
--   * baseline, measured in the same run and interleaved with the turns: a
--     bare `docker run --rm` of a no-op static binary with exactly the same
--     sealed argv (container.args of the same kind of spec);
--   * host RSS of this process idle (runtime built) and its peak while 8
--     channels run turns at once.
-- Run as the sbx account: build/sbx lua bench/turn_bench.lua [TURNS]
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local sandbox = require "sandbox"

local TURNS = tonumber(arg and arg[1]) or 20
local IMAGE = os.getenv("SBX_IMAGE") or "pi-roundtable-sandbox:local"

package.path = "bench/?.lua;" .. package.path
local B = require "bench_lib"
local bare_baseline = require "bare_baseline"
local sh, q, summary = B.sh, B.q, B.summary

local function rss_kib()
  for line in io.lines("/proc/self/status") do
    local v = line:match("^VmRSS:%s+(%d+)")
    if v then return tonumber(v) end
  end
end

local root = B.private_root("turn_bench.lua", "tb")
local bare = bare_baseline.new(root)
local function bare_run() return bare:run() end

local server = B.instant_model()

local rt = sandbox.runtime {
  image = IMAGE, runRoot = root .. "/run", workspaceRoot = root .. "/work",
  model = "bench-model", modelUrl = server:url("/v1/chat/completions"),
  apiKey = function() return "bench-key" end, allowHttp = true,
  warm = { channels = 0 },         -- cold turns: bench/warm_bench.lua measures warm ones
}

local SPEAKER = { id = "u", name = "User", principalId = "p-u" }
local function turn(channel)
  local t0 = core.hrtime()
  local r = rt:run_turn(channel, SPEAKER, "hi")
  assert(r.ok and r.text == "done", "turn failed")
  return (core.hrtime() - t0) / 1e6
end

local ok, err = pcall(async.run, function()
  print(string.format("image %s; %d turns and %d bare runs, interleaved; machine: %s cores", IMAGE, TURNS, TURNS,
    sh("nproc")))
  turn("bench:warm"); bare_run()                     -- warm caches
  local idle = rss_kib()
  local turns, bare = {}, {}
  for i = 1, TURNS do
    bare[i] = bare_run()
    turns[i] = turn("bench:one")
  end
  local b = summary("bare docker run --rm (no-op)", bare)
  local t = summary("sealed turn (admission to reply)", turns)
  print(string.format("ratio p50 %.2fx   p95 %.2fx   (target: at most 1.5x)", t.p50 / b.p50, t.p95 / b.p95))

  local peak, running = idle, true
  local sampler = async.spawn(function()
    while running do
      peak = math.max(peak, rss_kib())
      async.sleep(5)
    end
  end)
  local tasks = {}
  local t0 = core.hrtime()
  for i = 1, 8 do tasks[i] = async.spawn(turn, "bench:ch" .. i) end
  for i = 1, 8 do assert(async.wait(tasks[i])) end
  local wall = (core.hrtime() - t0) / 1e6
  running = false
  async.wait(sampler)
  print(string.format("host RSS: idle %.1f MiB, peak with 8 channels active %.1f MiB (8 turns in %.0f ms)",
    idle / 1024, peak / 1024, wall))
end)
-- Cleanup whatever happened: the runtime, the server, the baseline image, the root.
pcall(async.run, function()
  local task = rt:dispose()
  if task then async.wait(task) end
end)
server:close()
bare:remove()
os.execute("rm -rf " .. q(root))
if not ok then error(err, 0) end
