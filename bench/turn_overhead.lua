-- bench/turn_overhead.lua: what one sealed container costs, and how much of
-- it is the driver's own. Run as the service account against a real daemon:
--
--   runuser -u sbx -- lua5.4 bench/turn_overhead.lua [N]
--
-- Builds a FROM-scratch image whose ENTRYPOINT is spec/fixtures/hostile/probe.c
-- in `noop` mode (prints a fixed reply, exits 0), then times, N times each:
--   bare      `docker run --rm -i <image> </dev/null` from a shell
--   sealed    the same `docker run` with the exact 4.3 argv, from a shell
--   driver    the CLI driver's run(spec, turn, signal) (spawn + stdin +
--             capped reads + reply parse + the explicit `docker rm --force`)
--   engine    the Engine API driver's run (create, attach, wait, start,
--             DELETE over the daemon's Unix socket; no CLI process)
-- and prints min / median / p90 in milliseconds. The image is removed at
-- the end.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "build/lua/?.so;" .. package.cpath

local async = require "sandbox.async"
local cli = require "sandbox.drivers.cli"
local engine = require "sandbox.drivers.engine"
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local installation = require "sandbox.runtime._installation"
local signal = require "sandbox.signal"

local N = tonumber(arg[1] or "20")

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local ok = p:close()
  return (out:gsub("%s+$", "")), ok
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local root = core.realpath(sh("mktemp -d /tmp/sbx-bench-XXXXXX"))
local image = "sbx-bench-noop:" .. core.random_hex(4)
local ok = pcall(function()
  os.execute("mkdir -p " .. q(root .. "/ctx") .. " " .. q(root .. "/run/turn-abc123") .. " " .. q(root .. "/work/ws"))
  assert(select(2, sh("cc -static -O2 -o " .. q(root .. "/ctx/probe") .. " spec/fixtures/hostile/probe.c")))
  local f = assert(io.open(root .. "/ctx/Dockerfile", "w"))
  f:write('FROM scratch\nCOPY probe /probe\nUSER 1000:1000\nENTRYPOINT ["/probe", "noop"]\n')
  f:close()
  assert(select(2, sh("docker build -q -t " .. q(image) .. " " .. q(root .. "/ctx"))))

  local uid, gid = core.getuid()
  local inst = installation.id(root .. "/work", root .. "/run")
  local function spec()
    return {
      name = container.name(core.sha256_hex("bench")), image = image,
      runDir = root .. "/run/turn-abc123", workspaceDir = root .. "/work/ws",
      uid = uid, gid = gid, memoryMb = 512, cpus = 1, pids = 64,
      labels = container.labels(inst, installation.owner_id()),
    }
  end
  local turn = { text = "hello", speaker = { id = "guest", name = "Guest" }, model = "m",
    prompt = "p", timeZone = "UTC", reset = false, tools = {}, mcp = {} }
  local d = cli { binary = "docker" }
  local e = engine {}

  local function stats(name, xs)
    table.sort(xs)
    local function pct(p) return xs[math.max(1, math.ceil(#xs * p))] end
    print(string.format("%-8s n=%d  min %.0f  median %.0f  p90 %.0f ms", name, #xs, xs[1], pct(0.5), pct(0.9)))
  end

  local function time_shell(cmd)
    local t0 = core.hrtime()
    local out, good = sh(cmd)
    assert(good and out:find('"noop"'), out)
    return (core.hrtime() - t0) / 1e6
  end

  local bare, sealed, drv, eng = {}, {}, {}, {}
  for i = 1, N + 1 do   -- the first round warms caches and is dropped
    local a = time_shell("docker run --rm -i " .. q(image) .. " </dev/null")
    local argv = container.args(spec())
    local parts = {}
    for j, v in ipairs(argv) do parts[j] = q(v) end
    local b = time_shell("docker " .. table.concat(parts, " ") .. " </dev/null")
    local c = async.run(function()
      local t0 = core.hrtime()
      local res = d:run(spec(), turn, signal.new())
      assert(res.ok and res.text == "noop")
      return (core.hrtime() - t0) / 1e6
    end)
    local x = async.run(function()
      local t0 = core.hrtime()
      local res = e:run(spec(), turn, signal.new())
      assert(res.ok and res.text == "noop")
      return (core.hrtime() - t0) / 1e6
    end)
    if i > 1 then
      bare[#bare + 1], sealed[#sealed + 1], drv[#drv + 1], eng[#eng + 1] = a, b, c, x
    end
  end
  stats("bare", bare)
  stats("sealed", sealed)
  stats("driver", drv)
  stats("engine", eng)
end)
sh("docker image rm -f " .. q(image) .. " >/dev/null 2>&1")
os.execute("rm -rf " .. q(root))
if not ok then os.exit(1) end
