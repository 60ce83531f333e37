-- rich/docker.lua: sandbox.rich.dockerDriver{socket=, labelProfile=, log=,
-- driver=}, the built-in driver of rich mode (spec/rich-mode.md 5.1, 5.4):
-- rich mode's driver table over the long-lived lifecycle of the driver
-- contract (drivers/_lasting.lua), so the sealed turns' two Docker drivers
-- serve rich mode too. The default is the Engine API driver
-- (drivers/engine.lua) on `socket`; `driver = require("sandbox.drivers").cli{}`
-- runs the same lifecycle through the docker CLI (`docker create`, `start`,
-- `container inspect`, `rm --force`, `logs`; drivers/cli.lua). Every call is
-- bounded by 15 s. The container is long-lived: ensureRunning keeps a
-- running container of the same image and profile, and replaces any other.
-- Every container it creates runs under the rich image's own seccomp
-- allow-list (worker/pi/seccomp.json, or opts.seccompProfile, an absolute
-- path), read once here: a missing, unreadable or malformed profile raises
-- `seccomp profile missing: <path>` (`... invalid: <path>`) at construction,
-- never a fallback to Docker's default. The Engine API body carries it in
-- SecurityOpt, the CLI argv as `--security-opt seccomp=<path>`.
--
--   local d = rich.dockerDriver { socket = "/var/run/docker.sock" }
--   d.ensureRunning(spec)   d.status(name) -> {state, image?, profile?}
--   d.remove(name)          d.logs(name, lines) -> text
--   docker.adapt(driver, labelProfile) -> rich mode's table for the `driver`
--                           option: a contract driver (drivers.cli{} or
--                           drivers.engine{}) wrapped, anything else as given
-- A status that is neither a success nor accepted raises, with the Engine
-- API driver, "docker <METHOD> <target> failed with <status>: <first 300
-- characters of the body>"; with the CLI driver "docker <command> <name>
-- failed with <exit status>: <first 300 characters of its stderr>".
local container = require "sandbox.rich._container"
local contract = require "sandbox.drivers.contract"
local engine = require "sandbox.drivers.engine"
local errors = require "sandbox.errors"
local seccomp = require "sandbox.runtime._seccomp"

local M = {}

M.DEFAULT_SOCKET = "/var/run/docker.sock"
M.DEFAULT_LABEL_PROFILE = "roundtable.sandbox.profile"
M.CALL_TIMEOUT_MS = engine.CALL_TIMEOUT_MS
M.MAX_ANSWER = engine.MAX_ANSWER
M.MAX_LOGS = engine.MAX_LOGS
M.BODY_CHARS = engine.BODY_CHARS

local function fail(msg) error(msg, 0) end

local function check_name(name)
  if not container.name_ok(name) then fail(errors.RICH_SPEC) end
end

-- True for a driver of the contract with the long-lived primitives.
function M.is_contract_driver(d)
  return type(d) == "table" and type(d.create_lasting) == "function" and type(d.inspect_container) == "function"
end

function M.new(opts)
  opts = opts or {}
  local d = opts.driver
  if d == nil then
    d = engine.new { socket = opts.socket or M.DEFAULT_SOCKET, call_timeout_ms = opts.callTimeoutMs }
  elseif not M.is_contract_driver(d) then
    error("sandbox.rich.dockerDriver: driver must be require('sandbox.drivers').cli{} or .engine{}", 2)
  else
    -- a supplied driver follows DOCKER_HOST: a remote daemon is refused (5.4)
    if type(d.check_endpoint) == "function" then d:check_endpoint() end
  end
  local label_profile = opts.labelProfile or M.DEFAULT_LABEL_PROFILE
  local log_option = opts.log
  local profile = seccomp.load(opts.seccompProfile or seccomp.default_path("rich"))
  local r = { socket = d.socket, driver = d, seccomp = { path = profile.path, count = profile.count } }

  function r.status(name)
    check_name(name)
    return contract.status(d, name, label_profile)
  end

  function r.remove(name)
    check_name(name)
    contract.remove_lasting(d, name)
  end

  function r.ensureRunning(spec)
    local logcfg = container.check(spec, log_option)
    local s = { seccomp = profile }
    for k, v in pairs(spec) do s[k] = v end
    s.seccomp = profile
    contract.ensure_running(d, s, logcfg, label_profile)
  end

  function r.logs(name, lines)
    check_name(name)
    return contract.logs(d, name, lines)
  end

  return r
end

function M.adapt(driver, label_profile)
  if M.is_contract_driver(driver) then return M.new { driver = driver, labelProfile = label_profile } end
  return driver
end

return setmetatable(M, { __call = function(_, opts) return M.new(opts) end })
