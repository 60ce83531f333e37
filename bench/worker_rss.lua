-- bench/worker_rss.lua: one real sealed turn end to end, and the worker's
-- memory: a fake model on loopback, a real broker on a private socket, and
-- pi-roundtable-sandbox:local run with the container settings of
-- spec/runtime.md 4.3 (plus --cgroup-parent, so the memory cgroup's peak
-- survives the container). Prints the reply, the exit status, what the fake
-- model saw, and the cgroup's peak usage.
--
--   build/sbx lua bench/worker_rss.lua [image]      (as a docker-group user)
--   build/sbx lua bench/worker_rss.lua --chroot     (as root, no Docker)
--   ... --heavy    the worst working set of worker.md section 9 item 37: 144
--                  channel notes of 2,048 characters (32 CJK), 20 history
--                  entries of 100,000 characters, a 20,000-character CJK message
--
-- --chroot runs the same turn without Docker to measure the process alone:
-- `unshare -m`, then GNU time around a chroot into the image's own root file
-- system (build/image/rootfs from `make image`), with the run directory,
-- the workspace and a tmpfs mounted at /broker, /workspace and /tmp; it
-- prints time's maximum resident set size of the worker process.
--
-- The peak is the cgroup's memory.max_usage_in_bytes (v1) or memory.peak
-- (v2) of the parent /sbxw-bench, which Docker creates; it counts the
-- worker's RSS plus the page cache of the files it read. It only grows, so
-- the figure is the largest of every run since the cgroup was made (as root
-- the bench resets it first). For the process alone see bench/worker_rss.sh.
local async = require "sandbox.async"
local core = require "sandbox.core"
local sandbox = require "sandbox"

local flags, positional = {}, {}
for _, a in ipairs(arg) do
  if a:match("^%-%-") then flags[a] = true else positional[#positional + 1] = a end
end
local chroot, heavy = flags["--chroot"], flags["--heavy"]
local image = positional[1] or "pi-roundtable-sandbox:local"
local PARENT = "sbxw-bench"
local REPLY = '{"id":"x","object":"chat.completion","choices":[{"index":0,"message":'
  .. '{"role":"assistant","content":"Hello from the sealed worker."},"finish_reason":"stop"}]}'

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return (out:gsub("%s+$", ""))
end

local function cgroup_file()
  for _, f in ipairs({ "/sys/fs/cgroup/memory/" .. PARENT .. "/memory.max_usage_in_bytes",
    "/sys/fs/cgroup/" .. PARENT .. "/memory.peak" }) do
    local h = io.open(f, "r")
    if h then h:close() return f end
  end
end

local dir = sh("mktemp -d /tmp/sbxw-bench-XXXXXX")
assert(dir:match("^/tmp/sbxw%-bench%-"))
os.execute("mkdir -m 700 '" .. dir .. "/run' '" .. dir .. "/work' && chmod 711 '" .. dir .. "'")

local seen = {}
local fake = assert(core.http_server({ on_request = function(req)
  seen[#seen + 1] = { auth = req.headers.authorization, body = req.body }
  req:reply(200, REPLY)
end }))

local broker = sandbox.broker({
  model = "bench-model", modelUrl = fake:url("/v1/chat/completions"), allowHttp = true,
  apiKey = function() return "bench-host-key" end,
  channel = "bench:one", speaker = { id = "guest", name = "Guest", principalId = "p-guest" },
})
assert(broker:start(dir .. "/run/broker.sock"))

local message = "hello"
if heavy then
  local notes = {}
  for i = 0, 143 do
    local t = i < 32 and string.rep("\u{4E16}", 2048) or string.rep("n", 2048)
    notes[#notes + 1] = string.format('{"scope":"channel","key":"note_%d","text":"%s"}', i, t)
  end
  local hist = {}
  for i = 1, 20 do
    hist[i] = string.format('{"role":"%s","content":"%s"}', i % 2 == 1 and "user" or "assistant",
      string.rep("h", 100000))
  end
  local f = assert(io.open(dir .. "/work/memory.json", "w"))
  f:write("[", table.concat(notes, ","), "]")
  f:close()
  f = assert(io.open(dir .. "/work/history.json", "w"))
  f:write("[", table.concat(hist, ","), "]")
  f:close()
  message = string.rep("\u{4E16}", 20000)
end

local uid_gid = sh("id -u") .. ":" .. sh("id -g")
local turn = '{"text":"' .. message .. '","speaker":{"id":"guest","name":"Guest"},"model":"bench-model",'
  .. '"prompt":"Be brief.","timeZone":"Asia/Taipei","reset":false,"tools":[],"mcp":[]}'
local args = { "run", "--rm", "--interactive", "--sig-proxy=false", "--log-driver", "none",
  "--pull", "never", "--name", "sbxw-bench-" .. tostring(os.time()),
  "--network", "none", "--read-only", "--cap-drop", "ALL",
  "--security-opt", "no-new-privileges:true", "--user", uid_gid, "--memory", "512m",
  "--memory-swap", "512m", "--cpus", "1", "--pids-limit", "64", "--ulimit", "nofile=256:256",
  "--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=64m,mode=1777",
  "--mount", "type=bind,src=" .. dir .. "/run,dst=/broker,readonly,bind-propagation=rprivate",
  "--mount", "type=bind,src=" .. dir .. "/work,dst=/workspace,bind-propagation=rprivate",
  "--env", "HOME=/tmp/home", "--cgroup-parent", "/" .. PARENT, image }

if chroot then
  local rootfs = sh("pwd") .. "/build/image/rootfs"
  assert(io.open(rootfs .. "/app/worker/sbx-worker", "r"), "run make image first")
  local script = string.format("mount --bind '%s/run' '%s/broker' && mount --bind '%s/work' "
    .. "'%s/workspace' && mount -t tmpfs -o size=64m tmpfs '%s/tmp' && "
    .. "exec /usr/bin/time -f maxrss_kb=%%M chroot '%s' /app/worker/sbx-worker",
    dir, rootfs, dir, rootfs, rootfs, rootfs)
  args = { "-m", "sh", "-c", script }
end

local status = 0
async.run(function()
  local f = cgroup_file()
  if f then os.execute("echo 0 > '" .. f .. "' 2>/dev/null") end   -- root only
  local t0 = core.now and core.now() or os.time()
  local res = async.await(function(resume)
    core.spawn({ file = chroot and "unshare" or "docker", args = args, stdin = turn,
      env = { "PATH=" .. os.getenv("PATH"), "HOME=" .. (os.getenv("HOME") or "/tmp"),
              "DOCKER_CONTEXT=default" },
      on_exit = resume })
  end)
  local t1 = core.now and core.now() or os.time()
  print("stdout:     " .. tostring(res.stdout))
  print("exit:       " .. tostring(res.exit_status) .. (res.error and (" " .. res.error) or ""))
  print("stderr:     " .. string.format("%q", tostring(res.stderr)))
  print("model calls " .. #seen .. "; authorization " .. tostring(seen[1] and seen[1].auth))
  print("model body: " .. tostring(seen[1] and seen[1].body):sub(1, 160) .. " ...")
  print("wall:       " .. tostring(t1 - t0))
  f = cgroup_file()
  if chroot then
    print("process:    " .. tostring(res.stderr:match("maxrss_kb=%d+")) .. " (GNU time, max RSS)")
  elseif f then
    local peak = tonumber(sh("cat '" .. f .. "'"))
    print(string.format("cgroup peak (%s): %d bytes = %.2f MiB", f, peak, peak / 1048576))
  else
    print("cgroup peak: not found")
  end
  local hist = io.open(dir .. "/work/history.json", "r")
  print("history:    " .. (hist and hist:read("a"):sub(1, 200) or "(none)"))
  if hist then hist:close() end
  if res.exit_status ~= 0 then status = 1 end
end)
broker:end_turn()
broker:stop()
fake:close()
core.run("nowait")
os.execute("rm -rf '" .. dir .. "'")
return status
