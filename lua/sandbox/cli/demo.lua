-- cli/demo.lua: `sbx demo`: two sealed turns against the built-in scripted
-- model (sandbox.cli._demo_model on 127.0.0.1), in a temporary channel, so the
-- second turn shows the memory the first one saved. Everything it creates
-- (the endpoint, the roots, the containers) is gone when it returns.
local async = require "sandbox.async"
local common = require "sandbox.cli._common"
local core = require "sandbox.core"
local demo_model = require "sandbox.cli._demo_model"
local layout = require "sandbox.runtime.layout"

local M = {}

M.IMAGE = "pi-roundtable-sandbox:local"
M.CHANNEL = "demo:roundtable"
M.SPEAKER = { id = "guest-1", name = "Alice", principalId = "demo-principal-1" }
M.TURNS = {
  "Please remember that the team lunch is on Friday at noon.",
  "What did I ask you to remember?",
}

M.help = [==[
usage: sbx demo [--image NAME] [--no-build] [--timeout MS]

Runs two sealed turns end to end against a built-in scripted Chat Completions
endpoint on 127.0.0.1 (no network, no real key):
  turn 1  the model asks for the host clock tool (host_clock) and saves a
          channel note (memory_set), then answers;
  turn 2  in a new container, it finds that note in the system prompt and
          answers with it.
The endpoint answers only requests carrying the per-run host key, which only
the broker holds; the containers only ever see the dummy key.

The channel lives in a private temporary directory (0700) that is removed at
the end, with no container left behind. Needs a local Docker daemon and the
image (built with `make image` when missing, unless --no-build). Refuses to
run as root: run it as the service account (`make demo` does that).

  --image NAME      worker image (default pi-roundtable-sandbox:local)
  --no-build        fail instead of building a missing image
  --timeout MS      per-turn deadline (default 60000)
]==]

local function say(...) io.stdout:write(...) io.stdout:write("\n") io.stdout:flush() end
local function warn(...) io.stderr:write("sbx demo: ", ...) io.stderr:write("\n") end

local function temp_base()
  local tmp = os.getenv("TMPDIR")
  if not tmp or tmp == "" or tmp:sub(1, 1) ~= "/" or #tmp > 40 then tmp = "/tmp" end
  tmp = tmp:gsub("/+$", "")
  return core.fs_mkdtemp(tmp .. "/sbx-demo-XXXXXX")
end

local clock = {
  name = "clock",
  description = "Read the current UTC time",
  parameters = { type = "object", properties = {}, additionalProperties = false },
  run = function(_input, ctx)
    ctx.signal:throw_if_aborted()
    return os.date("!%Y-%m-%dT%H:%M:%SZ")
  end,
}

-- The image, or a build of pi-roundtable-sandbox:local with this tree's own
-- command (sandbox.runtime.layout: `make image` in a checkout, the installed
-- context's build-image) when it is missing and may be built.
local function ensure_image(docker, image, may_build)
  if docker:inspect_image(image) then return true end
  local fix = layout.image_fix(image)
  if not may_build then
    warn("the image ", image, " is missing")
    io.stderr:write("  fix: ", fix, "\n")
    return false
  end
  local build = layout.image_build()
  if not build.command or image ~= M.IMAGE then
    warn("the image ", image, " is missing and sbx demo builds only ", M.IMAGE, " (with this installation's build command)")
    io.stderr:write("  fix: ", fix, "\n")
    return false
  end
  warn("building ", image, " (", build.command, ") ...")
  local ok = os.execute(build.command .. " 1>&2")
  if ok and docker:inspect_image(image) then return true end
  warn("could not build ", image)
  io.stderr:write("  fix: run ", build.command, " as a user of the docker group (or root), then rerun sbx demo\n")
  return false
end

local function rule(title)
  local line = "-- " .. title .. " "
  return line .. string.rep("-", math.max(4, 64 - #line))
end

local function count_tools(calls, from, to)
  local names = {}
  for i = from, to do
    for _, n in ipairs(calls[i] and calls[i].tools or {}) do names[#names + 1] = n end
  end
  return names
end

-- The containers of this installation still there after the turns (the
-- driver's own listing), and whether the listing worked.
local function leftover_containers(docker, installation)
  local listed, list = pcall(docker.list, docker, installation)
  local names = {}
  for _, c in ipairs(listed and list or {}) do names[#names + 1] = c.name end
  return names, listed
end

-- The demo proper, inside a task. Returns the exit status.
local function demo(opts)
  local docker = common.docker()    -- the turns' own docker runner (drivers/cli.lua)
  local info, why = docker:inspect_daemon()
  if not info then
    if why == "not found" then
      warn("the docker CLI is not installed")
      io.stderr:write("  fix: as root, make deps\n")
    elseif why == "permission denied" then
      warn(common.user_name(), " may not use the Docker socket")
      io.stderr:write("  fix: as root, usermod -aG docker ", common.user_name(), " (or run `make demo`)\n")
    else
      warn("the Docker daemon does not answer")
      io.stderr:write("  fix: as root, make deps (starts dockerd)\n")
    end
    return 1
  end
  if not ensure_image(docker, opts.image, opts.build) then return 1 end

  local base = temp_base()
  if not base then
    warn("cannot create a private temporary directory under /tmp")
    return 1
  end
  local key = "demo-host-key-" .. core.random_hex(16)
  local model, merr = demo_model.start { key = key, model = "demo-model" }
  if not model then
    core.fs_rmtree(base)
    warn("cannot start the scripted model on 127.0.0.1: ", tostring(merr))
    return 1
  end

  local rt, status, interrupted, current = nil, 1, false, nil
  local sigint = core.on_signal(core.SIGINT, function()
    interrupted = true
    if rt and current then rt:stop(current) end
  end)

  local ok, err = pcall(function()
    local runtime = require "sandbox.runtime"
    rt = runtime.new {
      image = opts.image, runRoot = base .. "/run", workspaceRoot = base .. "/ws",
      model = "demo-model", modelUrl = model.url, allowHttp = true,
      apiKey = function(_scope) return key end,
      tools = { clock }, turnTimeoutMs = opts.timeout, timeZone = common.time_zone(),
    }
    say("sbx demo: scripted model on ", model.url, " (loopback only; it answers only with the host key)")
    say("sbx demo: channel ", M.CHANNEL, ", temporary roots under ", base)
    local replies = {}
    for i, text in ipairs(M.TURNS) do
      if interrupted then break end
      say("")
      say(rule(i == 1 and "turn 1 (a fresh container)" or ("turn " .. i .. " (another fresh container)")))
      say(M.SPEAKER.name, ": ", text)
      local before = #model.calls
      local t0 = core.now()
      current = M.CHANNEL
      local reply, settled, res = rt:guest_turn(M.CHANNEL, M.SPEAKER, text)
      current = nil
      local secs = (core.now() - t0) / 1000
      local calls = #model.calls - before
      local asked = count_tools(model.calls, before + 1, #model.calls)
      say("sandbox: ", reply)
      if not settled or not res.ok then
        common.report_turn("demo", res, settled, nil, nil)
        return
      end
      replies[i] = reply
      say(string.format("         (%.1f s; %d model call%s%s)", secs, calls, calls == 1 and "" or "s",
        #asked > 0 and ("; the model asked for " .. table.concat(asked, " and ")) or ""))
    end
    if interrupted then return end
    say("")
    local authorized, total = 0, #model.calls
    for _, c in ipairs(model.calls) do if c.authorized then authorized = authorized + 1 end end
    say(string.format("sbx demo: the model endpoint saw the host key on %d of %d calls; the containers held only the dummy key.",
      authorized, total))
    if replies[2] and replies[2]:find("team lunch", 1, true) then
      say("sbx demo: turn 2 recalled turn 1's channel note from the workspace memory.")
      status = 0
    else
      warn("turn 2 did not recall turn 1's note")
    end
  end)
  sigint:stop()
  if not ok then common.report("demo", err, nil, nil) end
  if interrupted then warn("interrupted") status = 1 end

  -- Cleanup: every turn settled and removed its container; check, then
  -- remove the endpoint and the temporary roots.
  local installation = rt and rt.installation
  if rt then pcall(rt.dispose, rt) end
  model:close()
  local left = {}
  if installation then
    local names, listed = leftover_containers(docker, installation)
    if not listed then warn("could not list containers to check the cleanup") end
    for _, n in ipairs(names) do
      pcall(docker.remove, docker, n)
      left[#left + 1] = n
    end
  end
  local removed = core.fs_rmtree(base)
  if #left > 0 then
    warn("removed ", #left, " leftover container(s): ", table.concat(left, ", "))
    status = 1
  end
  if not removed then
    warn("could not remove ", base, "; remove it by hand: rm -rf ", base)
    status = 1
  end
  if #left == 0 and removed then
    say("sbx demo: cleaned up: no container left, temporary directories removed.")
  end
  return status
end

function M.run(args)
  local args_lib = require "sandbox.cli._args"
  local parsed, err = args_lib.parse(args, { interleave = true, flags = {
    image = "value", ["no-build"] = "bool", timeout = "value" } })
  if not parsed then
    io.stderr:write("sbx demo: ", err, "\n\n", M.help)
    return 2
  end
  if parsed.positional[1] then
    io.stderr:write("sbx demo: unexpected argument '", parsed.positional[1], "'\n\n", M.help)
    return 2
  end
  local timeout = 60000
  if parsed.flags.timeout then
    timeout = math.tointeger(tonumber(parsed.flags.timeout))
    if not require("sandbox.runtime._options").turn_timeout_ok(timeout) then
      io.stderr:write("sbx demo: --timeout must be 1000 to 600000 ms\n")
      return 2
    end
  end
  if core.getuid() == 0 then
    io.stderr:write("sbx demo: refusing to run as root (sealed workers never run as root).\n",
      "  fix: run it as the service account: runuser -u sbx -- sbx demo, or `make demo` (which does that)\n")
    return 1
  end
  return async.run(demo, { image = parsed.flags.image or M.IMAGE, build = not parsed.flags["no-build"],
    timeout = timeout })
end

return M
