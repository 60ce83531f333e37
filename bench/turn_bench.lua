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
local container = require "sandbox.runtime.container"
local core = require "sandbox.core"
local json = require "sandbox.json"
local sandbox = require "sandbox"

local TURNS = tonumber(arg and arg[1]) or 20
local IMAGE = os.getenv("SBX_IMAGE") or "pi-roundtable-sandbox:local"
local NOOP_IMAGE = "sbx-bench-noop:" .. core.random_hex(4)

package.path = "bench/?.lua;" .. package.path
local B = require "bench_lib"
local sh, q, summary = B.sh, B.q, B.summary

local function rss_kib()
  for line in io.lines("/proc/self/status") do
    local v = line:match("^VmRSS:%s+(%d+)")
    if v then return tonumber(v) end
  end
end

assert(core.getuid() ~= 0, "run as the sbx account (runuser -u sbx -- build/sbx lua bench/turn_bench.lua)")
local root = core.realpath(sh("mktemp -d /tmp/sbx-tb-XXXXXX"))
os.execute("chmod 700 " .. q(root) .. " && mkdir -m 700 -p " .. q(root .. "/base/run") .. " " .. q(root .. "/base/ws")
  .. " " .. q(root .. "/ctx"))

local out, ok = sh("cc -static -O2 -o " .. q(root .. "/ctx/probe") .. " spec/fixtures/hostile/probe.c")
assert(ok, out)
local f = assert(io.open(root .. "/ctx/Dockerfile", "w"))
f:write("FROM scratch\nCOPY probe /probe\nUSER 1000:1000\nENTRYPOINT [\"/probe\", \"noop\"]\n")
f:close()
out, ok = sh("docker build -q -t " .. NOOP_IMAGE .. " " .. q(root .. "/ctx"))
assert(ok, out)

local server = assert(core.http_server {
  on_request = function(req)
    req:reply(200, '{"choices":[{"message":{"role":"assistant","content":"done"}}]}')
  end,
})

local rt = sandbox.runtime {
  image = IMAGE, runRoot = root .. "/run", workspaceRoot = root .. "/work",
  model = "bench-model", modelUrl = server:url("/v1/chat/completions"),
  apiKey = function() return "bench-key" end, allowHttp = true,
  warm = { channels = 0 },         -- cold turns: bench/warm_bench.lua measures warm ones
}
local uid, gid = core.getuid()
local env = { "PATH=" .. (os.getenv("PATH") or "/usr/bin:/bin"), "HOME=" .. root, "DOCKER_CONTEXT=default" }

local function bare_run()
  local argv = container.args {
    name = "roundtable-sandbox-" .. core.random_hex(8) .. "-" .. core.random_hex(4), image = NOOP_IMAGE,
    runDir = root .. "/base/run", workspaceDir = root .. "/base/ws", uid = uid, gid = gid,
    memoryMb = 512, cpus = 1, pids = 64,
    labels = container.labels("bench", "bench"),
  }
  local t0 = core.hrtime()
  local res = async.await(function(resume)
    core.spawn { file = "docker", args = argv, env = env, stdin = "{}", on_exit = resume }
  end)
  assert(res.exit_status == 0, "bare docker run failed: " .. tostring(res.stderr or res.error))
  return (core.hrtime() - t0) / 1e6
end

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
sh("docker image rm " .. NOOP_IMAGE)
os.execute("rm -rf " .. q(root))
if not ok then error(err, 0) end
