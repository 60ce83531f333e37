-- cli/_common.lua: what the sbx subcommands share (Kong's kong/cmd/utils/):
-- the operator error report (its text and fix from sandbox.errors), the turn
-- flags of run and chat, loading a config into a runtime, the one docker
-- runner, and small terminal helpers. No subcommand requires another.
--
--   common.parse_turn_args(args, extra_flags) -> parsed, speaker | nil, usage error
--   common.open(cmd, parsed) -> rt, cfg | nil, exit status (reported)
--   common.report(cmd, err, cfg, config_path)   "sbx <cmd>: <what>" + "  fix: ..."
--   common.report_turn(cmd, res, settled, cfg, config_path) -> exit status:
--                      a turn's failure reason and fix (operations.md 1)
--   common.json_reply(settled, res, text) -> the --json line of run and chat:
--                      {"ok":..,"text":<the exact guest-visible text>,"reason":..}
--                      and, when the turn failed, what the operator acts on:
--                      "turn", "fix", and for an upstream failure "route",
--                      "status", "code", "type", "param", "cause"
--   common.fix_for(err, cfg, config_path) -> the catalogue's fix, or nil
--   common.docker() -> the CLI driver (drivers/cli.lua): the docker runner of
--                      the turns themselves, so doctor and demo ask the daemon
--                      the turns use (DOCKER_CONTEXT=default unless DOCKER_HOST)
--   common.time_zone() / common.user_name() / common.isatty(fd)
local args_lib = require "sandbox.cli._args"
local channel_key = require "sandbox.channels._key"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local options = require "sandbox.runtime._options"

local M = {}

function M.user_name()
  return options.user_name((core.getuid()))
end

-- The context a printed fix is filled with (errors.fix / reason_fix).
function M.fix_context(cfg, config_path)
  local o = cfg and cfg.options or {}
  local uid, gid = core.getuid()
  return {
    config = config_path, runRoot = o.runRoot, workspaceRoot = o.workspaceRoot, image = o.image,
    user = M.user_name(), uid = uid, gid = gid, docker_host = os.getenv("DOCKER_HOST"),
  }
end

-- The fix for an error a runtime construction or a turn raised, or nil.
function M.fix_for(err, cfg, config_path)
  return errors.fix(err, M.fix_context(cfg, config_path))
end

-- The fix printed with a failed turn's reason: the provider's tokens' fix
-- (upstream_status, reflection), else the reason's, with this config's names.
function M.fix_for_reason(res, cfg, config_path)
  if (res.reason == "upstream_status" or res.reason == "reflection") and res.fix then return res.fix end
  return errors.reason_fix(res.reason, M.fix_context(cfg, config_path)) or res.fix
end

-- Catalogue messages are fixed strings; anything else (a driver's or a Lua
-- error) is shown only with SBX_DEBUG=1, since it may quote payloads.
function M.describe(err)
  if errors.safe_to_show(err) then return err end
  if os.getenv("SBX_DEBUG") then return tostring(err) end
  return "unexpected error (set SBX_DEBUG=1 to see it)"
end

-- Writes "sbx <cmd>: <what>" and, when known, "  fix: <fix>" to stderr.
function M.report(cmd, err, cfg, config_path)
  io.stderr:write("sbx ", cmd, ": ", M.describe(err), "\n")
  local fix = M.fix_for(err, cfg, config_path)
  if fix then io.stderr:write("  fix: ", fix, "\n") end
end

-- The report of one turn on stderr (spec/operations.md 1): a turn refused
-- before it started as the catalogue error, else `sbx <cmd>: turn failed:
-- <reason>`, the provider's status line when there is one, the fix and the
-- catalogue message the host raised, if any (`  error: body too large`).
-- Returns the `sbx run` exit status of its class.
function M.report_turn(cmd, res, settled, cfg, config_path)
  if not settled then                    -- refused before it started
    M.report(cmd, res, cfg, config_path)
    local e = errors.entry(res)
    local usage = e and (e.name == "MESSAGE" or e.name == "TOO_LARGE" or e.name == "CHANNEL")
    return usage and errors.EXIT.usage or errors.EXIT.config
  end
  if res.ok then return errors.EXIT.ok end
  io.stderr:write("sbx ", cmd, ": turn failed: ", res.reason, "\n")
  if res.status or res.cause then
    local parts = { "route=" .. tostring(res.route) }
    if res.status then parts[#parts + 1] = "status=" .. tostring(res.status) end
    for _, k in ipairs { "code", "type", "param" } do
      if res[k] then parts[#parts + 1] = k .. "=" .. res[k] end
    end
    if res.cause then parts[#parts + 1] = "cause=" .. res.cause end
    if res.request_id then parts[#parts + 1] = "request_id=" .. res.request_id end
    io.stderr:write("  upstream: ", table.concat(parts, " "), "\n")
  end
  local fix = M.fix_for_reason(res, cfg, config_path)
  if fix then io.stderr:write("  fix: ", fix, "\n") end
  -- the cause behind the reason, never "unexpected error" (hardening.md 9);
  -- only when it is that reason's own message: a provider's refusal also
  -- ends the worker, and the worker-failed message beside it would mislead
  local e = res.error and errors.entry(res.error)
  if e and e.reason == res.reason and errors.safe_to_show(res.error) then
    io.stderr:write("  error: ", res.error, "\n")
  end
  return errors.exit_status(res.reason)
end

-- The line `sbx run --json` and `sbx chat --json` print for one turn: the
-- exact text, JSON-escaped (the terminal form replaces control characters,
-- shared/spec/hardening.md 6), and the turn's reason when it settled.
M.JSON_FAILURE_FIELDS = { "turn", "fix", "route", "status", "code", "type", "param", "cause", "request_id" }

function M.json_reply(settled, res, text)
  local names, values = { "ok", "text", "reason" }, {
    ok = settled and res.ok == true, text = text, reason = settled and res.reason or nil,
  }
  if settled and res.ok ~= true then
    for _, name in ipairs(M.JSON_FAILURE_FIELDS) do
      local v = res[name]
      if type(v) == "string" or math.type(v) == "integer" then
        names[#names + 1] = name
        values[name] = v
      end
    end
  end
  return json.encode(json.object(names, values))
end

-- $TZ as the worker's zone (one leading ':' dropped), or nil for UTC.
function M.time_zone()
  local tz = os.getenv("TZ")
  if tz == nil or tz == "" then return nil end
  tz = tz:gsub("^:", "")
  if tz == "" then return nil end
  return tz
end

-- Is file descriptor fd (0, 1 or 2) a terminal?
function M.isatty(fd)
  local ok = os.execute("test -t " .. math.tointeger(fd))
  return ok == true
end

function M.docker()
  return require("sandbox.drivers.cli").new { binary = "docker" }
end

-- --log-format FORMAT (run, chat, broker): the operator log's format over
-- the config's logFormat. Returns the format, or nil and a usage error.
function M.log_format(flag)
  if flag == nil then return nil end
  if flag ~= "text" and flag ~= "json" then return nil, '--log-format must be "text" or "json"' end
  return flag
end

-- Parses the shared flags of run and chat. Returns parsed, speaker or nil,
-- message (usage error).
function M.parse_turn_args(args, extra_flags)
  local flags = { channel = "value", speaker = "value", timeout = "value", ["log-format"] = "value" }
  for k, v in pairs(extra_flags or {}) do flags[k] = v end
  local parsed, err = args_lib.parse(args, { interleave = true, flags = flags })
  if not parsed then return nil, err end
  local f = parsed.flags
  if not parsed.positional[1] then return nil, "CONFIG.lua is required" end
  if not f.channel then return nil, "--channel KEY is required (e.g. --channel demo:1)" end
  if not channel_key.valid(f.channel) then
    return nil, "invalid --channel '" .. f.channel .. "': use a key like discord:1234 (^[a-z][a-z0-9_-]*:.+, at most 256 characters)"
  end
  local speaker, serr = args_lib.speaker(f.speaker)
  if not speaker then return nil, serr end
  if f.timeout then
    local t = math.tointeger(tonumber(f.timeout))
    if not options.turn_timeout_ok(t) then return nil, "--timeout must be 1000 to 600000 ms" end
    parsed.timeout = t
  end
  local lf, lerr = M.log_format(f["log-format"])
  if lerr then return nil, lerr end
  parsed.log_format = lf
  return parsed, speaker
end

-- The runtime of a loaded config under sbx: the app's own runtime options
-- (app:runtime_options; sbx has no host login, the zone is $TZ), with
-- --timeout over turnTimeoutMs. `sbx run` is one turn: warm turns off
-- (spec/warm-turns.md: it stays cold); `sbx chat` keeps the config's.
-- Raises the construction error.
local function runtime_of(cfg, timeout, log_format, cold)
  local opts, checked = cfg:runtime_options { timeZone = M.time_zone() }
  if timeout then opts.turnTimeoutMs = timeout end
  if log_format then opts.logFormat = log_format end
  if cold then opts.warm = { channels = 0 } end
  return require("sandbox.runtime").new(opts, checked)
end

-- Loads the config and builds the runtime; on failure reports it and
-- returns nil, exit status (errors.EXIT.config: the configuration is the
-- operator's to fix; a remote daemon endpoint too).
function M.open(cmd, parsed)
  local path = parsed.positional[1]
  local cfg, cerr = args_lib.load_config(path)
  if not cfg then
    io.stderr:write("sbx ", cmd, ": ", cerr, "\n")
    local fix = M.fix_for(cerr:match(": (.*)$"), nil, path)
    if fix then io.stderr:write("  fix: ", fix, "\n") end
    return nil, errors.EXIT.config
  end
  local ok, rt = pcall(runtime_of, cfg, parsed.timeout, parsed.log_format, cmd == "run")
  if not ok then
    M.report(cmd, rt, cfg, path)
    return nil, errors.EXIT.config
  end
  return rt, cfg
end

return M
