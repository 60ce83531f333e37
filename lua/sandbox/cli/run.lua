-- cli/run.lua: `sbx run CONFIG.lua --channel KEY --speaker ID[:NAME[:PRINCIPAL]]
-- TEXT`: one sealed turn through the runtime; the reply on stdout.
--
-- Also the helpers `sbx chat` and `sbx demo` share: building a runtime from a
-- loaded config (M.runtime_from_config), naming the fix for an operator error
-- (M.fix_for), the guest-visible texts, running docker (M.docker).
local args_lib = require "sandbox.cli._args"
local async = require "sandbox.async"
local core = require "sandbox.core"

local M = {}

-- Guest-visible texts (spec/runtime.md 5.7): the runtime's own constants.
local has_rt, runtime_mod = pcall(require, "sandbox.runtime")
if not has_rt then runtime_mod = {} end
M.GUEST_FAILED_OR_STOPPED = runtime_mod.GUEST_FAILED_OR_STOPPED or "The sandbox turn failed or was stopped."
M.GUEST_FAILED = runtime_mod.GUEST_FAILED or "The sandbox turn failed."

M.help = [==[
usage: sbx run CONFIG.lua --channel KEY --speaker ID[:NAME[:PRINCIPAL]] [--] TEXT

Runs one sealed turn: TEXT is the guest's message, answered by a fresh
container for channel KEY with the memory and history of that channel's
workspace. Prints the reply on stdout and exits 0; when the turn fails, prints
the guest-visible text ("The sandbox turn failed." or "The sandbox turn failed
or was stopped.") on stdout, the reason on stderr, and exits 1. Operator
errors (config, directories, docker) exit 2 (usage) or 1 and name the fix.

  --channel KEY     channel key, e.g. discord:1234 (^[a-z][a-z0-9_-]*:.+)
  --speaker S       ID[:NAME[:PRINCIPAL]]: the guest; NAME and PRINCIPAL
                    default to ID (PRINCIPAL never reaches the container)
  --timeout MS      turn deadline in ms (1000 to 600000; default: the
                    config's turnTimeoutMs, 120000)
  TEXT              the message; several words are joined with spaces;
                    "-" reads it from stdin

The config's apiKey is mandatory under sbx (there is no host login), and the
time zone the worker sees is $TZ (default UTC). Ctrl-C stops the turn.
Run `sbx doctor CONFIG.lua` first if a turn fails for no visible reason.
]==]

-- ---------------------------------------------------------------------------
-- Shared helpers

local function user_name()
  local uid = core.getuid()
  local f = io.open("/etc/passwd", "r")
  if f then
    for line in f:lines() do
      local name, id = line:match("^([^:]*):[^:]*:(%d+):")
      if id and tonumber(id) == uid then f:close() return name end
    end
    f:close()
  end
  return tostring(uid)
end
M.user_name = user_name

-- The fix for an error a runtime construction or a turn raised, or nil.
function M.fix_for(err, cfg, config_path)
  local o = cfg and cfg.options or {}
  local config = config_path or "CONFIG.lua"
  local uid, gid = core.getuid()
  local fixes = {
    ["sandbox roots must be private directories owned by the service user"] =
      string.format("chown %s: %s %s && chmod 700 %s %s (run `sbx doctor %s` to see which)",
        user_name(), o.runRoot or "RUNROOT", o.workspaceRoot or "WORKSPACEROOT",
        o.runRoot or "RUNROOT", o.workspaceRoot or "WORKSPACEROOT", config),
    ["sandbox roots must be absolute dedicated directories"] =
      "set runRoot and workspaceRoot to absolute paths of directories used only by this package",
    ["sandbox roots must be separate"] = "use two separate directories for runRoot and workspaceRoot, neither inside the other",
    ["run the host as a non-root user; worker uid/gid must match it"] = uid == 0
      and "run sbx as the service account, e.g. `runuser -u sbx -- sbx ...`"
      or string.format("remove uid/gid from the config or set uid = %d, gid = %d", uid, gid),
    ["broker socket path too long"] = "choose a runRoot of at most 76 bytes, e.g. /tmp/roundtable-sandbox-run",
    ["another host process owns these sandbox directories"] =
      "stop the other process that uses this runRoot (a bot or another sbx), or give this one its own runRoot and workspaceRoot",
    ["remote Docker daemons are unsupported"] = "unset DOCKER_HOST (or set it to unix:///var/run/docker.sock)",
    ["Docker sandbox execution requires a native Linux host"] = "run sealed turns on a native Linux host with a local Docker daemon",
    ["invalid time zone"] = "set TZ to an IANA zone name such as UTC or Europe/London, or unset it",
    ["apiKey is required when no host login is available"] =
      "add apiKey = function() return os.getenv(\"MODEL_API_KEY\") end to the config and export MODEL_API_KEY",
    ["apiKey must be a function"] = "make apiKey a function, e.g. apiKey = function() return os.getenv(\"MODEL_API_KEY\") end",
    ["sandbox worker failed"] = string.format("check the image and the daemon with `sbx doctor %s`", config),
    ["sandbox container cleanup failed; inspect this installation's containers"] =
      string.format("run `sbx cleanup %s --force`", config),
    ["sandbox turn timed out"] = "raise turnTimeoutMs in the config (or --timeout) if turns need longer",
    ["sandbox is stopped or channel is busy"] = "wait for the channel's running turn to finish",
    ["invalid sandbox channel"] = "use a channel key like discord:1234 (^[a-z][a-z0-9_-]*:.+, at most 256 characters)",
    ["sandbox message too large"] = "keep the message within 32000 characters and speaker fields within 256",
    ["invalid sandbox message"] = "give a non-empty speaker ID and valid UTF-8 text",
  }
  if type(err) ~= "string" then return nil end
  if fixes[err] then return fixes[err] end
  if err:find("sandbox.drivers.cli", 1, true) then
    return "the Docker CLI driver (lua/sandbox/drivers/cli.lua) is missing from this build"
  end
  return nil
end

-- Errors the runtime raises are fixed strings; anything else (a driver or
-- Lua error) is shown only with SBX_DEBUG=1, since it may quote payloads.
local KNOWN_PREFIX = {
  "sandbox ", "invalid ", "broker ", "apiKey ", "run the host", "remote Docker", "Docker sandbox",
  "another host", "a sandbox turn", "model is required", "unknown sandbox option", "turnTimeoutMs",
  "routing state", "stateFile", "the Docker CLI driver",
}

function M.describe(err)
  if type(err) == "string" then
    for _, p in ipairs(KNOWN_PREFIX) do
      if err:sub(1, #p) == p then return err end
    end
  end
  if os.getenv("SBX_DEBUG") then return tostring(err) end
  return "unexpected error (set SBX_DEBUG=1 to see it)"
end

-- Writes "sbx <cmd>: <what>" and, when known, "  fix: <fix>" to stderr.
function M.report(cmd, err, cfg, config_path)
  local what = M.describe(err)
  io.stderr:write("sbx ", cmd, ": ", what, "\n")
  local fix = M.fix_for(err, cfg, config_path)
  if fix then io.stderr:write("  fix: ", fix, "\n") end
end

-- $TZ as the worker's zone (one leading ':' dropped), or nil for UTC.
function M.time_zone()
  local tz = os.getenv("TZ")
  if tz == nil or tz == "" then return nil end
  tz = tz:gsub("^:", "")
  if tz == "" then return nil end
  return tz
end

-- A runtime for a loaded `sandbox{}` config (spec/runtime.md 2.1: the
-- runtime takes the options minus stateFile, initialChannels and provider,
-- plus the time zone). Raises the runtime's construction error.
function M.runtime_from_config(cfg, overrides)
  local sandbox = require "sandbox"
  if type(cfg.runtime) == "function" then return cfg:runtime(overrides) end
  local runtime = require "sandbox.runtime"
  local o = cfg.options
  if type(o.apiKey) ~= "function" then error("apiKey is required when no host login is available", 0) end
  local opts = {}
  for k, v in pairs(o) do
    if k ~= "stateFile" and k ~= "initialChannels" and k ~= "provider" then opts[k] = v end
  end
  opts.timeZone = M.time_zone()
  for k, v in pairs(overrides or {}) do opts[k] = v end
  local _ = sandbox
  return runtime.new(opts)
end

-- Inside a task: runs `docker ARGS...` and returns {code=, stdout=, stderr=}
-- or nil, reason ("not found" when there is no docker binary).
M.DOCKER_ENV = nil
function M.docker(args, opts)
  opts = opts or {}
  local env = { "PATH=" .. (os.getenv("PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") }
  for _, name in ipairs({ "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT" }) do
    local v = os.getenv(name)
    if v and v ~= "" then env[#env + 1] = name .. "=" .. v end
  end
  if core.spawn then
    local proc, timer
    local res = async.await(function(resume)
      local ok, p = pcall(core.spawn, {
        file = "docker", args = args, env = env, stdin = opts.stdin or "",
        max_stdout = opts.max_stdout or 1048576, max_stderr = 65536,
        on_exit = resume,
      })
      if not ok then resume({ error = tostring(p), code = "EINVAL" }) else proc = p end
      if ok and opts.timeout_ms then
        timer = core.timer(opts.timeout_ms, function() pcall(proc.kill, proc, 9) end)
      end
    end)
    if timer then timer:stop() end
    if res.error then
      if res.code == "ENOENT" then return nil, "not found" end
      return nil, res.error
    end
    return { code = res.exit_status or 1, signal = res.term_signal, stdout = res.stdout or "",
             stderr = res.stderr or "" }
  end
  -- Fallback without core.spawn (blocks the loop; only used before it lands).
  local q = {}
  for i, a in ipairs(args) do q[i] = "'" .. a:gsub("'", "'\\''") .. "'" end
  local errf = os.tmpname()
  local p = io.popen("docker " .. table.concat(q, " ") .. " 2>" .. errf .. " </dev/null", "r")
  if not p then os.remove(errf) return nil, "not found" end
  local out = p:read("a")
  local _, _, code = p:close()
  local ef = io.open(errf, "r")
  local err = ef and ef:read("a") or ""
  if ef then ef:close() end
  os.remove(errf)
  if code == 127 then return nil, "not found" end
  return { code = code or 1, stdout = out or "", stderr = err }
end

-- Is file descriptor fd (0, 1 or 2) a terminal?
function M.isatty(fd)
  local ok = os.execute("test -t " .. math.tointeger(fd))
  return ok == true
end

-- Parses the shared flags of run and chat. Returns parsed, speaker or nil,
-- message (usage error).
function M.parse_turn_args(args, extra_flags)
  local flags = { channel = "value", speaker = "value", timeout = "value" }
  for k, v in pairs(extra_flags or {}) do flags[k] = v end
  local parsed, err = args_lib.parse(args, { interleave = true, flags = flags })
  if not parsed then return nil, err end
  local f = parsed.flags
  if not parsed.positional[1] then return nil, "CONFIG.lua is required" end
  if not f.channel then return nil, "--channel KEY is required (e.g. --channel demo:1)" end
  if not require("sandbox.channels._key").valid(f.channel) then
    return nil, "invalid --channel '" .. f.channel .. "': use a key like discord:1234 (^[a-z][a-z0-9_-]*:.+, at most 256 characters)"
  end
  local speaker, serr = args_lib.speaker(f.speaker)
  if not speaker then return nil, serr end
  if f.timeout then
    local t = math.tointeger(tonumber(f.timeout))
    if not t or t < 1000 or t > 600000 then return nil, "--timeout must be 1000 to 600000 ms" end
    parsed.timeout = t
  end
  return parsed, speaker
end

-- Loads the config and builds the runtime; on failure reports it and
-- returns nil, exit status.
function M.open(cmd, parsed)
  local path = parsed.positional[1]
  local cfg, cerr = args_lib.load_config(path)
  if not cfg then
    io.stderr:write("sbx ", cmd, ": ", cerr, "\n")
    local fix = M.fix_for(cerr:match(": (.*)$"), nil, path)
    if fix then io.stderr:write("  fix: ", fix, "\n") end
    return nil, 1
  end
  local ok, rt = pcall(M.runtime_from_config, cfg, parsed.timeout and { turnTimeoutMs = parsed.timeout } or nil)
  if not ok then
    M.report(cmd, rt, cfg, path)
    return nil, 1
  end
  return rt, cfg
end

-- ---------------------------------------------------------------------------
-- sbx run

function M.run(args)
  local parsed, speaker = M.parse_turn_args(args)
  if not parsed then
    io.stderr:write("sbx run: ", speaker, "\n\n", M.help)
    return 2
  end
  local words = table.move(parsed.positional, 2, #parsed.positional, 1, {})
  local text = table.concat(words, " ")
  if #words == 1 and words[1] == "-" then text = (io.read("a") or ""):gsub("\n$", "") end
  if text == "" then
    io.stderr:write("sbx run: TEXT is required (the guest's message)\n\n", M.help)
    return 2
  end
  local channel = parsed.flags.channel
  local rt, cfg = M.open("run", parsed)
  if not rt then return cfg end
  local path = parsed.positional[1]
  local status = async.run(function()
    local sig = core.on_signal(core.SIGINT, function()
      if rt:stop(channel) then io.stderr:write("\nsbx run: stopping the turn\n") end
    end)
    local term = core.on_signal(core.SIGTERM, function() rt:stop(channel) end)
    local ok, res = pcall(rt.run_turn, rt, channel, speaker, text)
    sig:stop()
    term:stop()
    local code
    if not ok then
      io.stdout:write(M.GUEST_FAILED_OR_STOPPED, "\n")
      M.report("run", res, cfg, path)
      code = 1
    elseif type(res) ~= "table" or res.ok ~= true then
      io.stdout:write(M.GUEST_FAILED, "\n")
      io.stderr:write("sbx run: the worker answered ok=false (for example its model-call limit, or a model or tool error)\n")
      code = 1
    else
      io.stdout:write(res.text, "\n")
      code = 0
    end
    pcall(rt.dispose, rt)
    return code
  end)
  return status
end

return M
