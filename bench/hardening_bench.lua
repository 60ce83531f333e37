-- bench/hardening_bench.lua: what the hostile-guest hardening costs an
-- honest turn (shared/spec/hardening.md; issue 11, item 4), in one run:
--   * seccomp: a cold sealed turn (a fresh container, the real worker, one
--     model call to an instant scripted model on loopback) under the
--     project's own profile (worker/seccomp.json) against the same turn under
--     Docker's default profile (the spec without seccompProfile), interleaved;
--   * watchdog: the same turn with the disk watchdog against one whose
--     runtime has it replaced by a no-op (this file's seam, not the
--     product's), interleaved; and the cost of one watchdog tick with eight
--     turns registered (statfs of the roots and of each workspace).
-- Run as the sbx account: build/sbx lua bench/hardening_bench.lua [TURNS]
local async = require "sandbox.async"
local core = require "sandbox.core"
local disk = require "sandbox.runtime._disk"
local sandbox = require "sandbox"

local TURNS = tonumber(arg and arg[1]) or 20
local IMAGE = os.getenv("SBX_IMAGE") or "pi-roundtable-sandbox:local"

package.path = "bench/?.lua;" .. package.path
local B = require "bench_lib"
local sh, q, summary = B.sh, B.q, B.summary

local root = B.private_root("hardening_bench.lua", "hb")

local server = B.instant_model()

local cli = require("sandbox.drivers.cli") { binary = "docker" }
-- Docker's default profile: the same spec without the project's profile.
local default_profile = {
  run = function(_, spec, turn, signal, report)
    spec.seccompProfile = nil
    return cli:run(spec, turn, signal, report)
  end,
  list = function(_, ...) return cli:list(...) end,
  remove = function(_, ...) return cli:remove(...) end,
}

local function runtime(name, over)
  local o = {
    image = IMAGE, runRoot = root .. "/" .. name .. "/run", workspaceRoot = root .. "/" .. name .. "/work",
    model = "bench-model", modelUrl = server:url("/v1/chat/completions"),
    apiKey = function() return "bench-key" end, allowHttp = true, driver = cli,
    logLevel = "warn",                    -- the per-turn info lines are not the bench's output
    warm = { channels = 0 },       -- cold turns: warm_bench.lua measures warm ones
  }
  for k, v in pairs(over or {}) do o[k] = v end
  return sandbox.runtime(o)
end

local own = runtime("own")
local docker = runtime("docker", { driver = default_profile })
-- A runtime whose watchdog never ticks (its before-turn checks stay).
local real_watchdog = disk.watchdog
disk.watchdog = function()
  return { add = function() end, remove = function() end, stop = function() end }
end
local unwatched = runtime("unwatched")
disk.watchdog = real_watchdog

local SPEAKER = { id = "u", name = "User", principalId = "p-u" }
local function turn(rt, channel)
  local t0 = core.hrtime()
  local r = rt:run_turn(channel, SPEAKER, "hi")
  assert(r.ok and r.text == "done", "turn failed")
  return (core.hrtime() - t0) / 1e6
end

local ok, err = pcall(async.run, function()
  print(string.format("image %s; %d turns per series, interleaved; machine: %s cores", IMAGE, TURNS, sh("nproc")))
  for _, rt in ipairs { own, docker, unwatched } do turn(rt, "bench:warm") end
  local a, b, c = {}, {}, {}
  for i = 1, TURNS do
    a[i] = turn(docker, "bench:one")
    b[i] = turn(own, "bench:one")
    c[i] = turn(unwatched, "bench:one")
  end
  local d = summary("turn, Docker's default profile", a, 40)
  local o = summary("turn, the project's profile (watched)", b, 40)
  local u = summary("turn, the project's profile, no watchdog", c, 40)
  print(string.format("seccomp: own/default ratio p50 %.2fx   p95 %.2fx", o.p50 / d.p50, o.p95 / d.p95))
  print(string.format("watchdog: with/without ratio p50 %.2fx   p95 %.2fx", o.p50 / u.p50, o.p95 / u.p95))

  -- one tick with 8 turns registered, none growing
  local wd = disk.watchdog(own.options)
  for i = 1, 8 do
    local ws = root .. "/own/work/" .. core.sha256_hex("bench:tick" .. i)
    core.fs_mkdir_p(ws)
    wd.turns[{ signal = { aborted = false } }] = { workspace = ws, start = disk.before_turn(own.options, ws) }
    wd.count = wd.count + 1
  end
  local n, t0 = 2000, core.hrtime()
  for _ = 1, n do wd:tick() end
  local us = (core.hrtime() - t0) / 1e3 / n
  print(string.format("one watchdog tick, 8 turns: %.1f us (while turns run: every %d ms %.3f%% of one core;"
    .. " every %d ms, little room above the reserve, %.3f%%)",
    us, disk.TICK_MS, us / 1000 / disk.TICK_MS * 100, disk.MIN_TICK_MS, us / 1000 / disk.MIN_TICK_MS * 100))
end)
pcall(async.run, function()
  for _, rt in ipairs { own, docker, unwatched } do rt:dispose() end
end)
server:close()
os.execute("rm -rf " .. q(root))
if not ok then error(err, 0) end
