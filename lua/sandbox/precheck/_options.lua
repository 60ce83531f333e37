-- precheck/_options.lua: the precheck runner's options and construction
-- checks (shared/spec/precheck.md 2 and 2.1), in the table's exact order and
-- with its exact error strings (raised with no position prefix). The root,
-- user, limits and container-argument rules are the sealed runtime's own
-- (lua/sandbox/runtime/_options.lua, lua/sandbox/drivers/_sealed.lua),
-- called with the precheck's parameters.
local broker_config = require "sandbox.broker._config"
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local lines = require "sandbox.ops.lines"
local log = require "sandbox.log"
local metrics = require "sandbox.ops.metrics"
local record = require "sandbox.ops.record"
local runtime_options = require "sandbox.runtime._options"

local M = {}

M.E_OPTIONS = errors.PRECHECK_OPTIONS
M.E_UNKNOWN = errors.PRECHECK_UNKNOWN_OPTION
M.E_LINUX = errors.LINUX
M.E_BUDGET = errors.PRECHECK_BUDGET
M.E_TIMEOUT = errors.PRECHECK_TIMEOUT
M.E_GRANT = errors.PRECHECK_GRANT_FN
M.E_TOOL_NAME = errors.PRECHECK_TOOL_NAME_FN
M.E_ROOT_PATH = errors.ROOT_PATH
M.E_ROOT_PRIVATE = errors.ROOT_PRIVATE
M.E_USER = errors.USER
M.E_SOCKET = errors.SOCKET_TOO_LONG
M.E_NAME_IMAGE = errors.NAME_IMAGE
M.E_ENTRYPOINT = errors.ENTRYPOINT
M.E_LIMITS = errors.LIMITS
M.E_MOUNT_PATH = errors.MOUNT_PATH
M.E_DRIVER = errors.PRECHECK_DRIVER
M.E_FETCH = errors.PRECHECK_FETCH

M.OPTIONS = {
  image = true, runRoot = true, uid = true, gid = true, grant = true, toolName = true,
  entrypoint = true, timeoutMs = true, maxCalls = true, allowHttpMcp = true, limits = true,
  driver = true, fetchImpl = true,
  -- the operator log and audit of spec/operations.md 2-3, as sandbox{} has them
  logFormat = true, logLevel = true, audit = true, logger = true,
}

M.ENTRYPOINT = { "/usr/local/bin/bun", "/app/precheck-main.mjs" }
M.DEFAULT_MAX_CALLS = 16
M.MAX_CALLS_LIMIT = 100
M.DEFAULT_TIMEOUT_MS = 60000
M.DEFAULT_LIMITS = { memoryMb = 256, cpus = 1, pids = 32 }
M.SOCKET_SUFFIX = "/precheck-XXXXXX/broker.sock"
M.MAX_SOCKET_PATH = 100
M.MAX_RUN_ROOT_BYTES = M.MAX_SOCKET_PATH - #M.SOCKET_SUFFIX      -- 72
M.PREFLIGHT_NAME = "precheck-preflight"

local function fail(msg) error(msg, 0) end

local as_integer = container.as_integer

function M.copy_list(list)
  local out = {}
  for i, v in ipairs(list) do out[i] = v end
  return out
end

-- The container spec of one run, or of the construction dry run (row 10):
-- everything spec/precheck.md 6.1 puts on the docker command line. The
-- entrypoint is o's own list (a run passes a copy).
function M.container_spec(o, name, run_dir, workspace_dir)
  local limits = o.limits or M.DEFAULT_LIMITS
  return {
    name = name, image = o.image, runDir = run_dir, workspaceDir = workspace_dir,
    uid = o.uid, gid = o.gid, memoryMb = limits.memoryMb, cpus = limits.cpus, pids = limits.pids,
    labels = false, workspaceReadOnly = true, entrypoint = o.entrypoint,
  }
end

local function default_driver()
  local cli = require "sandbox.drivers.cli"
  return require("sandbox.precheck._docker").new(cli.new { binary = "docker" })
end

-- Runs rows 1-10 of 2.1 and returns the resolved options: {image, runRoot
-- (canonical), uid, gid, grant, toolName, entrypoint, timeoutMs (nil when
-- not given), maxCalls, allowHttpMcp, limits, driver, fetchImpl, logger
-- (sandbox/log.lua), recorder (sandbox/ops/record.lua: its reader writes
-- the broker's audit lines)}. The log options are checked after the
-- table's rows, with sandbox{}'s own strings.
function M.resolve(opts)
  if type(opts) ~= "table" then fail(M.E_OPTIONS) end
  broker_config.check_option_names(opts, M.OPTIONS, M.E_UNKNOWN)
  -- 1
  if opts.driver == nil and not runtime_options.is_linux() then fail(M.E_LINUX) end
  -- 2
  local max_calls = M.DEFAULT_MAX_CALLS
  if opts.maxCalls ~= nil then
    max_calls = as_integer(opts.maxCalls)
    if not max_calls or max_calls < 1 or max_calls > M.MAX_CALLS_LIMIT then fail(M.E_BUDGET) end
  end
  -- 3
  local timeout
  if opts.timeoutMs ~= nil then
    timeout = as_integer(opts.timeoutMs)
    if not timeout or timeout < 1000 or timeout > 600000 then fail(M.E_TIMEOUT) end
  end
  -- 4, 5
  if type(opts.grant) ~= "function" then fail(M.E_GRANT) end
  if opts.toolName ~= nil and type(opts.toolName) ~= "function" then fail(M.E_TOOL_NAME) end
  -- 6, 7: absolute and not "/", created 0700, private, canonical
  local puid, pgid = core.getuid()
  runtime_options.check_root(opts.runRoot, puid)
  local run_root = core.realpath(opts.runRoot)
  if not run_root then fail(M.E_ROOT_PRIVATE) end
  if run_root == "/" then fail(M.E_ROOT_PATH) end
  -- 8
  local uid = opts.uid == nil and puid or as_integer(opts.uid)
  local gid = opts.gid == nil and pgid or as_integer(opts.gid)
  if not uid or not gid or uid <= 0 or gid <= 0 or uid ~= puid or gid ~= pgid then fail(M.E_USER) end
  -- 9
  if #run_root > M.MAX_RUN_ROOT_BYTES then fail(M.E_SOCKET) end
  -- 10: the argument builder on paths of the right shape; nothing is created
  local limits = runtime_options.resolve_limits(opts.limits, M.DEFAULT_LIMITS)
  local entrypoint = opts.entrypoint == nil and M.ENTRYPOINT or opts.entrypoint
  local resolved = {
    image = opts.image, runRoot = run_root, uid = uid, gid = gid, grant = opts.grant,
    toolName = opts.toolName, entrypoint = entrypoint, timeoutMs = timeout,
    maxCalls = max_calls, allowHttpMcp = opts.allowHttpMcp == true,
    limits = limits or M.DEFAULT_LIMITS, fetchImpl = opts.fetchImpl,
  }
  local dry = M.container_spec(resolved, M.PREFLIGHT_NAME, run_root .. "/precheck-preflight",
    run_root .. "/precheck-ws-preflight")
  dry.canonical = true
  container.args(dry)
  if not limits then fail(M.E_LIMITS) end
  resolved.entrypoint = M.copy_list(entrypoint)   -- checked by the builder: a plain list
  -- the trusted seams
  if opts.fetchImpl ~= nil and type(opts.fetchImpl) ~= "function" then fail(M.E_FETCH) end
  local driver = opts.driver
  if driver == nil then
    driver = default_driver()
  elseif type(driver) ~= "table" or type(driver.exec) ~= "function" then
    fail(M.E_DRIVER)
  end
  resolved.driver = driver
  log.check_options(opts)
  resolved.logger = log.from_options(opts)
  resolved.recorder = record.recorder()
  resolved.recorder:subscribe(lines.reader(resolved.logger, { audit = opts.audit }))
  -- the one metrics registry type, read from the same records: each run is
  -- sbx_turns_total{mode="precheck",reason=...} (spec/operations.md 4)
  resolved.metrics = metrics.new { mode = "precheck" }
  resolved.recorder:subscribe(resolved.metrics:reader())
  return resolved
end

return M
