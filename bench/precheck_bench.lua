-- bench/precheck_bench.lua: the precheck runner's overhead (issue 14, item 5).
--   * precheck run: runner.run of a script that makes one granted MCP call
--     (mcp.json through the per-run broker to the SDK fixture server on
--     loopback), from the call to the answer: grant, run and workspace
--     directories, broker, container start, bun, the entry script, the call,
--     the answer, container removal (plus nothing else), cleanup;
--   * baseline, measured in the same run and interleaved with the prechecks:
--     a bare sealed `docker run --rm` of the same image with exactly the
--     same argv (container.args of a precheck spec) running an empty script.
-- Also prints the image's size. Run as the sbx account:
--   build/sbx lua bench/precheck_bench.lua [RUNS]
local async = require "sandbox.async"
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local json = require "sandbox.json"
local sandbox = require "sandbox"

package.path = "spec/support/?.lua;" .. package.path
local mcp = require "mcp_server"           -- the SDK fixture server

local RUNS = tonumber(arg and arg[1]) or 20
local IMAGE = os.getenv("SBX_PRECHECK_IMAGE") or "pi-roundtable-sandbox:precheck"

package.path = "bench/?.lua;" .. package.path
local B = require "bench_lib"
local sh, q = B.sh, B.q
local function summary(name, ms) return B.summary(name, ms, 44) end

assert(core.getuid() ~= 0, "run as the sbx account (runuser -u sbx -- build/sbx lua bench/precheck_bench.lua)")
local size = sh("docker image inspect --format '{{.Size}}' " .. IMAGE)
assert(tonumber(size), "make image first: " .. size)
local root = core.realpath(sh("mktemp -d /tmp/sbx-pb-XXXXXX"))
os.execute("chmod 700 " .. q(root) .. " && mkdir -m 700 -p " .. q(root .. "/base/run") .. " " .. q(root .. "/base/ws"))
local server = mcp.start {}

local runner = sandbox.precheckScriptRunner {
  image = IMAGE, runRoot = root .. "/run", allowHttpMcp = true,
  grant = function()
    return { { name = "health", url = server.url, tools = { "garmin-get-hrv" }, token = function() return "bench-token" end } }
  end,
}
local SCRIPT = [[export default async ({ mcp, today }) => {
  const { hrv } = await mcp.json("health", "garmin-get-hrv", { date: today });
  return { wake: false, note: `HRV ${hrv}` };
};]]
local n = 0
local function context()
  n = n + 1
  return {
    schedule = { id = n, title = "bench", channel = "bench:c", target = "bench:t", createdTier = "owner" },
    firedAt = "2026-10-04T05:00:00.000Z", tier = "member", timeZone = "UTC", today = "2026-10-04",
    tools = { { server = "health", tool = "garmin-get-hrv" } },
  }
end

local uid, gid = core.getuid()
local env = { "PATH=" .. (os.getenv("PATH") or "/usr/bin:/bin"), "HOME=" .. root, "DOCKER_CONTEXT=default" }
local EMPTY = json.encode(json.object({ "script", "firedAt", "timeZone", "today", "schedule", "servers" }, {
  script = "", firedAt = "2026-10-04T05:00:00.000Z", timeZone = "UTC", today = "2026-10-04",
  schedule = json.object({ "id", "title" }, { id = 0, title = "bench" }), servers = json.array {},
}))

local function bare_run()
  local spec = sandbox.precheck.container_spec({
    image = IMAGE, uid = uid, gid = gid, entrypoint = sandbox.PRECHECK_ENTRYPOINT,
    limits = { memoryMb = 256, cpus = 1, pids = 32 },
  }, "roundtable-precheck-bench-" .. core.random_hex(4), root .. "/base/run", root .. "/base/ws")
  local argv = container.args(spec)
  local t0 = core.hrtime()
  local res = async.await(function(resume)
    core.spawn { file = "docker", args = argv, env = env, stdin = EMPTY, on_exit = resume }
  end)
  assert(res.exit_status == 0, "bare docker run failed: " .. tostring(res.stderr or res.error))
  assert(res.stdout:find('"ok":false', 1, true), "the empty script did not answer")
  return (core.hrtime() - t0) / 1e6
end

local function precheck()
  local t0 = core.hrtime()
  local r = runner.run(SCRIPT, context())
  assert(r.note == "HRV 22", "precheck failed")
  return (core.hrtime() - t0) / 1e6
end

local ok, err = pcall(async.run, function()
  print(string.format("image %s, size %s bytes (%.1f MiB); %d prechecks and %d bare runs, interleaved; %s cores",
    IMAGE, size, tonumber(size) / 1048576, RUNS, RUNS, sh("nproc")))
  precheck(); bare_run()                          -- warm caches
  local runs, bare = {}, {}
  for i = 1, RUNS do
    bare[i] = bare_run()
    runs[i] = precheck()
  end
  local b = summary("bare docker run --rm (empty script)", bare)
  local p = summary("precheck run (one granted MCP call)", runs)
  print(string.format("ratio p50 %.2fx   p95 %.2fx", p.p50 / b.p50, p.p95 / b.p95))
  local left = core.fs_readdir(root .. "/run")
  print(string.format("runRoot entries left: %d", #left))
end)
server:stop()
os.execute("rm -rf " .. q(root))
if not ok then error(err, 0) end
