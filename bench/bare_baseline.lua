-- bench/bare_baseline.lua: the baseline the turn benches divide by: a bare
-- sealed `docker run --rm` of a no-op static binary (probe.c's `noop`, built
-- FROM scratch here) with exactly the sealed argv of a turn's container
-- (container.args of the same kind of spec), timed from spawn to exit.
--   local bare = require("bare_baseline").new(root)   -- root: a private 0700 dir
--   local ms = bare:run()                             -- inside a task
--   bare:remove()                                     -- the image it built
local async = require "sandbox.async"
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local B = require "bench_lib"

local M = {}
local Bare = {}
Bare.__index = Bare

function M.new(root)
  local self = setmetatable({ root = root, image = "sbx-bench-noop:" .. core.random_hex(4) }, Bare)
  os.execute("mkdir -m 700 -p " .. B.q(root .. "/base/run") .. " " .. B.q(root .. "/base/ws") .. " "
    .. B.q(root .. "/ctx"))
  local out, ok = B.sh("cc -static -O2 -o " .. B.q(root .. "/ctx/probe") .. " spec/fixtures/hostile/probe.c")
  assert(ok, out)
  local f = assert(io.open(root .. "/ctx/Dockerfile", "w"))
  f:write("FROM scratch\nCOPY probe /probe\nUSER 1000:1000\nENTRYPOINT [\"/probe\", \"noop\"]\n")
  f:close()
  out, ok = B.sh("docker build -q -t " .. self.image .. " " .. B.q(root .. "/ctx"))
  assert(ok, out)
  self.uid, self.gid = core.getuid()
  self.env = { "PATH=" .. (os.getenv("PATH") or "/usr/bin:/bin"), "HOME=" .. root, "DOCKER_CONTEXT=default" }
  return self
end

function Bare:run()
  local argv = container.args {
    name = "roundtable-sandbox-" .. core.random_hex(8) .. "-" .. core.random_hex(4), image = self.image,
    runDir = self.root .. "/base/run", workspaceDir = self.root .. "/base/ws", uid = self.uid, gid = self.gid,
    memoryMb = 512, cpus = 1, pids = 64, labels = container.labels("bench", "bench"),
  }
  local t0 = core.hrtime()
  local res = async.await(function(resume)
    core.spawn { file = "docker", args = argv, env = self.env, stdin = "{}", on_exit = resume }
  end)
  assert(res.exit_status == 0, "bare docker run failed: " .. tostring(res.stderr or res.error))
  return (core.hrtime() - t0) / 1e6
end

function Bare:remove()
  B.sh("docker image rm " .. self.image)
end

return M
