-- drivers/cli.lua: the default container driver, `docker` run as a child
-- process (spec/runtime.md 4.1, 4.5-4.8, 6.3 step 1, 8.3-8.4).
--
--   local cli = require "sandbox.drivers.cli"
--   local d = cli { binary = "docker" }        -- or cli.new{...}
--   d:run(spec, turn, signal) -> {ok=, text=}  (yields; raises 4.8 errors)
--   d:list(installation)      -> {{name=, owner=}, ...}  (yields)
--   d:remove(name)            -> nothing, or raises the cleanup error
--
-- Options: binary (default "docker", looked up on the child's PATH);
-- getenv (default os.getenv: where PATH, HOME, DOCKER_* are read);
-- remove_timeout_ms / list_timeout_ms (default 5000; spec seams only).
--
-- Every docker child gets the minimal environment of 4.5, its three standard
-- streams as pipes and no other descriptor (core.spawn). The run CLI is only
-- ever stopped with SIGKILL (never a signal to the container); the container
-- is then removed by its exact name with the algorithm of 4.7.
local async = require "sandbox.async"
local container = require "sandbox.runtime.container"
local core = require "sandbox.core"
local json = require "sandbox.json"

local M = {}

M.E_TOO_LARGE = "body too large"
M.E_WORKER = "sandbox worker failed"
M.E_REPLY = "invalid sandbox reply"
M.E_CLEANUP = "sandbox container cleanup failed; inspect this installation's containers"
M.E_REMOTE = "remote Docker daemons are unsupported"

M.MAX_STDOUT = 2097152          -- 2 MiB
M.MAX_STDERR = 131072           -- 128 KiB
M.MAX_RM_STDERR = 16384         -- 16 KiB
M.MAX_RM_STDOUT = 65536         -- discarded
M.MAX_LIST_STDOUT = 1048576     -- 1 MiB
M.MAX_TEXT_CHARS = 100000
M.REMOVE_TIMEOUT_MS = 5000
M.LIST_TIMEOUT_MS = 5000
M.REMOVE_ATTEMPTS = 3
M.SECOND_REMOVAL_DELAY_MS = 100
M.DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

local Driver = {}
Driver.__index = Driver

local function fail(msg) error(msg, 0) end

-- DOCKER_HOST unset/empty, or unix://<absolute path> (4.5).
function M.local_endpoint(value)
  if value == nil or value == "" then return true end
  local path = value:match("^unix://(/.*)$")
  return path ~= nil and not path:find("%z")
end

-- The child environment of 4.5, as a list of "NAME=value".
function M.environment(getenv)
  getenv = getenv or os.getenv
  local env = {}
  local path = getenv("PATH")
  env[#env + 1] = "PATH=" .. ((path and path ~= "") and path or M.DEFAULT_PATH)
  local home = getenv("HOME")
  if home and home ~= "" then env[#env + 1] = "HOME=" .. home end
  local config = getenv("DOCKER_CONFIG")
  if config and config ~= "" then env[#env + 1] = "DOCKER_CONFIG=" .. config end
  local host = getenv("DOCKER_HOST")
  if host and host ~= "" then
    env[#env + 1] = "DOCKER_HOST=" .. host
  else
    env[#env + 1] = "DOCKER_CONTEXT=default"
  end
  return env
end

function M.new(opts)
  opts = opts or {}
  local binary = opts.binary or "docker"
  if type(binary) ~= "string" or binary == "" or binary:find("%z") then
    error("sandbox.drivers.cli: binary must be a non-empty string", 2)
  end
  local getenv = opts.getenv or os.getenv
  return setmetatable({
    binary = binary,
    getenv = getenv,
    remove_timeout_ms = opts.remove_timeout_ms or M.REMOVE_TIMEOUT_MS,
    list_timeout_ms = opts.list_timeout_ms or M.LIST_TIMEOUT_MS,
    builtin = true,
  }, Driver)
end

-- Startup check for the built-in driver (3.1 step 13).
function Driver:check_endpoint()
  if not M.local_endpoint(self.getenv("DOCKER_HOST")) then fail(M.E_REMOTE) end
end

-- Spawns the binary with args and waits for it; kill_after_ms arms a SIGKILL
-- timer; on_proc(proc) sees the process once started. Returns core.spawn's
-- result table (res.error when it could not start).
function Driver:exec(args, o)
  o = o or {}
  local proc, timer
  local res = async.await(function(resume)
    proc = core.spawn {
      file = self.binary, args = args, env = M.environment(self.getenv), stdin = o.stdin,
      max_stdout = o.max_stdout, max_stderr = o.max_stderr,
      kill_on_overflow = o.kill_on_overflow, on_exit = resume,
    }
    if o.kill_after_ms then
      timer = core.timer(o.kill_after_ms, function()
        timer = nil
        proc:kill(core.SIGKILL)
      end)
    end
    if o.on_proc then o.on_proc(proc) end
  end)
  if timer then timer:stop() end
  proc:kill(core.SIGKILL)     -- harmless once exited; the core has reaped it
  return res
end

-- One `docker rm --force <name>` attempt: "ok", "retry" or "fail".
function Driver:remove_attempt(name)
  local res = self:exec({ "rm", "--force", name }, {
    max_stdout = M.MAX_RM_STDOUT, max_stderr = M.MAX_RM_STDERR,
    kill_after_ms = self.remove_timeout_ms,
  })
  if res.error or res.stderr_truncated then return "fail" end
  if res.exit_status == 0 and res.term_signal == 0 then return "ok" end
  local text = res.stderr:lower()
  if text:find("no such container") or text:find("no such object") then return "ok" end
  -- Lua's '.' matches newlines too.
  if text:find("removal.*already in progress") then return "retry" end
  return "fail"
end

-- The removal algorithm of 4.7 for one exact name; raises the cleanup error.
function Driver:remove(name)
  if type(name) ~= "string" or #name > 91 or not name:find("^[a-z0-9][a-z0-9_.%-]*$") then
    fail(M.E_CLEANUP)
  end
  for attempt = 1, M.REMOVE_ATTEMPTS do
    local r = self:remove_attempt(name)
    if r == "ok" then return end
    if r ~= "retry" or attempt == M.REMOVE_ATTEMPTS then break end
    async.sleep(100 * attempt)
  end
  fail(M.E_CLEANUP)
end

-- Every container (any state) labelled with this installation (6.3 step 1).
function Driver:list(installation)
  if type(installation) ~= "string" or not installation:find("^%x+$") then fail(M.E_CLEANUP) end
  local res = self:exec({
    "ps", "--all", "--no-trunc",
    "--filter", "label=" .. container.LABEL_INSTALLATION .. "=" .. installation,
    "--format", '{{.Names}}\\t{{.Label "' .. container.LABEL_OWNER .. '"}}',
  }, { max_stdout = M.MAX_LIST_STDOUT, max_stderr = M.MAX_STDERR, kill_after_ms = self.list_timeout_ms })
  if res.error or res.exit_status ~= 0 or res.term_signal ~= 0 or res.stdout_truncated then
    fail(M.E_CLEANUP)
  end
  local out = {}
  for line in res.stdout:gmatch("[^\n]+") do
    local name, owner = line:match("^([^\t]*)\t(.*)$")
    if not name then name, owner = line:match("^(.-)\\t(.*)$") end
    if not name then name, owner = line, "" end
    out[#out + 1] = { name = name, owner = owner }
  end
  return out
end

-- Reads the worker's stdout per 4.6 step 9 / 8.4: {ok=, text=} or raises.
function M.parse_reply(stdout)
  if stdout:sub(1, 3) == "\239\187\191" or not json.utf8_valid(stdout) then fail(M.E_REPLY) end
  local v = json.decode(stdout)
  if v == nil or json.kind(v) ~= "object" then fail(M.E_REPLY) end
  if type(v.ok) ~= "boolean" or type(v.text) ~= "string" then fail(M.E_REPLY) end
  local n = utf8.len(v.text)
  if not n or n > M.MAX_TEXT_CHARS then fail(M.E_REPLY) end
  return { ok = v.ok, text = v.text }
end

local abort_reason = container.abort_reason

-- One turn in one fresh container (4.6).
function Driver:run(spec, turn, signal)
  -- 1
  local argv = container.args(spec)
  local name = spec.name
  local input = container.run_input(spec, turn)
  -- 2
  if signal and signal.aborted then error(abort_reason(signal), 0) end
  -- 3-6
  local unregister
  local res = self:exec(argv, {
    stdin = input, max_stdout = M.MAX_STDOUT, max_stderr = M.MAX_STDERR, kill_on_overflow = true,
    on_proc = function(proc)
      if signal then
        unregister = signal:on_abort(function() proc:kill(core.SIGKILL) end)
      end
    end,
  })
  if unregister then unregister() end
  if res.error then error(res.error, 0) end   -- nothing started, nothing to remove
  local failed = res.exit_status ~= 0 or res.term_signal ~= 0
  local ok, out = pcall(function()
    if res.stdout_truncated or res.stderr_truncated then fail(M.E_TOO_LARGE) end  -- 6
    if signal and signal.aborted then error(abort_reason(signal), 0) end          -- 7
    if failed then fail(M.E_WORKER) end                                             -- 8
    return M.parse_reply(res.stdout)                                               -- 9
  end)
  -- 10: always, last. A removal failure replaces whatever came before.
  self:remove(name)
  if (signal and signal.aborted) or failed then
    async.sleep(M.SECOND_REMOVAL_DELAY_MS)
    self:remove(name)
  end
  if not ok then error(out, 0) end
  return out
end

return setmetatable(M, { __call = function(_, opts) return M.new(opts) end })
