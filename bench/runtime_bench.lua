-- bench/runtime_bench.lua: a cold sealed turn under each container runtime
-- the daemon has registered (shared/spec/warm-turns.md 4 and 5: "runsc and
-- crun cold turns / runc cold turn", reported), in one run: three runtimes
-- with identical options but `runtime` (nil = the daemon's default, runc;
-- "runsc"; "crun"), a fresh container per turn, the real worker, one model
-- call through the broker to an instant scripted model on loopback, from
-- admission to reply and removal; the series interleaved. A runtime that is
-- not registered, or whose first turn fails, is reported as such (its
-- reason and error) and left out of the rest.
-- Run as the sbx account: build/sbx lua bench/runtime_bench.lua [TURNS]
local async = require "sandbox.async"
local core = require "sandbox.core"
local sandbox = require "sandbox"

local TURNS = tonumber(arg and arg[1]) or 20
local IMAGE = os.getenv("SBX_IMAGE") or "pi-roundtable-sandbox:local"

package.path = "bench/?.lua;" .. package.path
local B = require "bench_lib"
local sh, q, summary = B.sh, B.q, B.summary

local root = B.private_root("runtime_bench.lua", "rb")

local server = B.instant_model()

local cli = require("sandbox.drivers.cli") { binary = "docker" }
local registered = async.run(function() return cli:runtimes() end) or {}

local SERIES = { { label = "runc", runtime = nil }, { label = "runsc", runtime = "runsc" },
  { label = "crun", runtime = "crun" } }
for _, s in ipairs(SERIES) do
  s.rt = sandbox.runtime {
    image = IMAGE, runRoot = root .. "/" .. s.label .. "/run", workspaceRoot = root .. "/" .. s.label .. "/work",
    model = "bench-model", modelUrl = server:url("/v1/chat/completions"),
    apiKey = function() return "bench-key" end, allowHttp = true, driver = cli,
    logLevel = "error",                  -- the per-turn lines are not the bench's output
    runtime = s.runtime,
    warm = { channels = 0 },       -- cold turns: warm_bench.lua measures warm ones
  }
end

local SPEAKER = { id = "u", name = "User", principalId = "p-u" }
-- ms, or nil and why the turn failed.
local function turn(rt, channel)
  local t0 = core.hrtime()
  local r = rt:run_turn(channel, SPEAKER, "hi")
  if not (r.ok and r.text == "done") then return nil, string.format("%s (%s)", tostring(r.reason), tostring(r.error)) end
  return (core.hrtime() - t0) / 1e6
end

local ok, err = pcall(async.run, function()
  print(string.format("image %s; %d turns per series, interleaved; machine: %s cores", IMAGE, TURNS, sh("nproc")))
  local live = {}
  for _, s in ipairs(SERIES) do
    local name = s.runtime or "runc"
    if not registered[name] then
      print(string.format("%-6s not registered with the daemon (make deps RUNSC=1): not measured", s.label))
    else
      local ms, why = turn(s.rt, "bench:warm")
      if ms then
        s.ms = {}
        live[#live + 1] = s
      else
        -- the daemon's own words (a turn reports only its reason)
        local said = sh("docker run --rm --runtime " .. q(name) .. " --network none " .. q(IMAGE) .. " </dev/null")
        print(string.format("%-6s FAILED: its first turn ended with %s: not measured\n       docker run --runtime %s: %s",
          s.label, why, name, said:match("(Error response[^\n]*)") or said:match("([^\n]*)")))
      end
    end
  end
  assert(live[1] and live[1].label == "runc", "the runc series failed: nothing to compare with")
  for i = 1, TURNS do
    for _, s in ipairs(live) do s.ms[i] = assert(turn(s.rt, "bench:one")) end
  end
  local base
  for _, s in ipairs(live) do
    local r = summary(s.label .. " cold turn (admission to reply)", s.ms, 40)
    if s.label == "runc" then
      base = r
    else
      print(string.format("%s / runc: p50 %.2fx   p95 %.2fx", s.label, r.p50 / base.p50, r.p95 / base.p95))
    end
  end
end)
-- Cleanup whatever happened: the runtimes, the server, the root.
pcall(async.run, function()
  for _, s in ipairs(SERIES) do
    local task = s.rt:dispose()
    if task then async.wait(task) end
  end
end)
server:close()
os.execute("rm -rf " .. q(root))
if not ok then error(err, 0) end
