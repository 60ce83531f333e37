-- drivers/cli.lua: the default container driver, `docker` run as a child
-- process (spec/runtime.md 4.1, 4.5-4.8, 6.3 step 1, 8.3-8.4). It is the
-- primitives of drivers/contract.lua over core.spawn; the run and removal
-- algorithms are the contract's.
--
--   local cli = require "sandbox.drivers.cli"
--   local d = cli { binary = "docker" }        -- or cli.new{...}
--   d:run(spec, turn, signal) -> {ok=, text=}  (yields; raises 4.8 errors)
--   d:list(installation)      -> {{name=, owner=}, ...}  (yields)
--   d:remove(name)            -> nothing, or raises the cleanup error
--   d:exec(args, o)           -> core.spawn's result: any docker command with
--                                the 4.5 environment (sbx doctor and sbx demo
--                                use it too, so they ask the daemon the turns use)
--   d:inspect_daemon() / d:inspect_image(image)   (sbx doctor, sbx demo)
--   d:ensure_running(spec, logcfg, label) / d:status(name, label) / d:logs(name, n)
--                                the long-lived lifecycle (drivers/_lasting.lua)
--                                with `docker container inspect`, `create`,
--                                `start`, `rm --force` and `logs`; rich mode
--                                reaches it through rich/docker.lua
--
-- Options: binary (default "docker", looked up on the child's PATH);
-- getenv (default os.getenv: where PATH, HOME, DOCKER_* are read);
-- remove_timeout_ms / list_timeout_ms (default 5000; spec seams only);
-- call_timeout_ms (default 15000: each command of the long-lived lifecycle).
--
-- Every docker child gets the minimal environment of 4.5, its three standard
-- streams as pipes and no other descriptor (core.spawn). The run CLI is only
-- ever stopped with SIGKILL (never a signal to the container); the container
-- is then removed by its exact name with the algorithm of 4.7.
local async = require "sandbox.async"
local container = require "sandbox.drivers._sealed"
local contract = require "sandbox.drivers.contract"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local lasting = require "sandbox.drivers._lasting"
local rich = require "sandbox.drivers._rich"

local M = {}

-- The contract's texts and limits, under the names this driver always had.
M.E_TOO_LARGE, M.E_WORKER, M.E_REPLY = contract.E_TOO_LARGE, contract.E_WORKER, contract.E_REPLY
M.E_CLEANUP, M.E_REMOTE = contract.E_CLEANUP, contract.E_REMOTE
M.MAX_STDOUT, M.MAX_STDERR, M.MAX_RM_STDERR = contract.MAX_STDOUT, contract.MAX_STDERR, contract.MAX_RM_STDERR
M.MAX_LIST_STDOUT, M.MAX_TEXT_CHARS = contract.MAX_LIST, contract.MAX_TEXT_CHARS
M.REMOVE_TIMEOUT_MS, M.LIST_TIMEOUT_MS = contract.REMOVE_TIMEOUT_MS, contract.LIST_TIMEOUT_MS
M.REMOVE_ATTEMPTS, M.SECOND_REMOVAL_DELAY_MS = contract.REMOVE_ATTEMPTS, contract.SECOND_REMOVAL_DELAY_MS
M.local_endpoint = contract.local_endpoint
M.parse_reply = contract.parse_reply

M.MAX_RM_STDOUT = 65536         -- discarded
M.INSPECT_TIMEOUT_MS = 20000
M.CALL_TIMEOUT_MS = 15000       -- each command of the long-lived lifecycle (rich-mode.md 5.4)
M.MAX_ANSWER = 1024 * 1024
M.MAX_LOGS = 8 * 1024 * 1024
M.TEXT_CHARS = 300
M.DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

local Driver = contract.methods({})
Driver.__index = Driver

local function fail(msg) error(msg, 0) end

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
    call_timeout_ms = opts.call_timeout_ms or M.CALL_TIMEOUT_MS,
    builtin = true,
  }, Driver)
end

-- Startup check for the built-in driver (3.1 step 13).
function Driver:check_endpoint()
  if not M.local_endpoint(self.getenv("DOCKER_HOST")) then fail(M.E_REMOTE) end
end

-- Spawns the binary with args and waits for it; kill_after_ms arms a SIGKILL
-- timer; on_proc(proc) sees the process once started. Returns core.spawn's
-- result table (res.error, res.code when it could not start; res.timed_out
-- when the kill_after_ms timer killed it).
function Driver:exec(args, o)
  o = o or {}
  local proc, timer, timed_out
  local res = async.await(function(resume)
    proc = core.spawn {
      file = self.binary, args = args, env = M.environment(self.getenv), stdin = o.stdin,
      stdin_open = o.stdin_open,
      max_stdout = o.max_stdout, max_stderr = o.max_stderr,
      kill_on_overflow = o.kill_on_overflow, on_exit = resume,
    }
    if o.kill_after_ms then
      timer = core.timer(o.kill_after_ms, function()
        timer = nil
        timed_out = true
        proc:kill(core.SIGKILL)
      end)
    end
    if o.on_proc then o.on_proc(proc) end
  end)
  if timer then timer:stop() end
  proc:kill(core.SIGKILL)     -- harmless once exited; the core has reaped it
  res.timed_out = timed_out
  return res
end

-- Primitives of drivers/contract.lua ---------------------------------------

-- `docker run` creates and starts in one command: nothing to ask the daemon
-- before start.
function Driver:create(c, signal)
  return { argv = container.argv(c), signal = signal }
end

-- Spawns `docker run` with the turn on stdin (then EOF), or with input nil
-- its stdin left open for feed (a warm container); an abort SIGKILLs the
-- CLI, never the container (4.6 step 4).
function Driver:start(h, input, max_stdout)
  h.task = async.spawn(self.exec, self, h.argv, {
    stdin = input, stdin_open = input == nil, max_stdout = max_stdout or M.MAX_STDOUT,
    max_stderr = M.MAX_STDERR, kill_on_overflow = true,
    on_proc = function(proc)
      h.proc = proc
      if h.signal then
        h.unregister = h.signal:on_abort(function()
          proc:kill(core.SIGKILL)
          -- a warm container's stdin, still open: closed, so nothing the
          -- CLI started can wait on it
          if input == nil then proc:write_stdin("") end
        end)
      end
    end,
  })
end

-- A warm container's turn on the CLI's stdin (docker run -i forwards it),
-- then end of file.
function Driver:feed(h, input)
  return h.proc ~= nil and h.proc:write_stdin(input) == true
end

function Driver:read(h)
  local ok, res = async.wait(h.task)
  if not ok then error(res, 0) end
  h.res = res
  if res.error then return nil, nil, res.error end
  return res.stdout, res.stdout_truncated or res.stderr_truncated
end

function Driver:wait(h)
  local res = h.res
  if res == nil then return nil end
  if res.term_signal ~= 0 then return nil end
  return res.exit_status
end

-- `docker run` reports its status as it exits, which read already waited
-- for: no wait is left to bound.
function Driver:wait_within(h, _)
  return self:wait(h)
end

function Driver:release(h)
  if h.unregister then h.unregister() end
  h.unregister = nil
end

-- True when docker's stderr says the container does not exist.
local function missing(res)
  local text = (res.stderr or ""):lower()
  return text:find("no such container", 1, true) ~= nil or text:find("no such object", 1, true) ~= nil
end

-- One `docker rm --force <name>` attempt: "ok", "retry" or "fail".
function Driver:remove_once(name)
  local res = self:exec({ "rm", "--force", name }, {
    max_stdout = M.MAX_RM_STDOUT, max_stderr = M.MAX_RM_STDERR,
    kill_after_ms = self.remove_timeout_ms,
  })
  if res.error or res.stderr_truncated then return "fail" end
  if res.exit_status == 0 and res.term_signal == 0 then return "ok" end
  if missing(res) then return "ok" end
  local text = res.stderr:lower()
  -- Lua's '.' matches newlines too.
  if text:find("removal.*already in progress") then return "retry" end
  return "fail"
end

function Driver:list_once(installation)
  local res = self:exec({
    "ps", "--all", "--no-trunc",
    "--filter", "label=" .. container.LABEL_INSTALLATION .. "=" .. installation,
    "--format", '{{.Names}}\\t{{.Label "' .. container.LABEL_OWNER .. '"}}',
  }, { max_stdout = M.MAX_LIST_STDOUT, max_stderr = M.MAX_STDERR, kill_after_ms = self.list_timeout_ms })
  if res.error or res.exit_status ~= 0 or res.term_signal ~= 0 or res.stdout_truncated then return nil end
  local out = {}
  for line in res.stdout:gmatch("[^\n]+") do
    local name, owner = line:match("^([^\t]*)\t(.*)$")
    if not name then name, owner = line:match("^(.-)\\t(.*)$") end
    if not name then name, owner = line, "" end
    out[#out + 1] = { name = name, owner = owner }
  end
  return out
end

-- The daemon behind this CLI: {version=, root=} (its DockerRootDir), or nil
-- and "not found" (no docker binary), "cannot run" (the binary would not
-- start), "permission denied" (the socket) or "no answer".
function Driver:inspect_daemon()
  local res = self:exec({ "info", "--format", "{{.ServerVersion}}|{{.DockerRootDir}}" },
    { max_stdout = M.MAX_RM_STDOUT, max_stderr = M.MAX_STDERR, kill_after_ms = M.INSPECT_TIMEOUT_MS })
  if res.error then return nil, res.code == "ENOENT" and "not found" or "cannot run" end
  if res.exit_status ~= 0 or res.term_signal ~= 0 then
    if (res.stderr or ""):lower():find("permission denied", 1, true) then return nil, "permission denied" end
    return nil, "no answer"
  end
  local version, root = res.stdout:match("^([^|\n]*)|([^\n]*)")
  return { version = version, root = root }
end

-- Why `docker run` exited non-zero, from the daemon itself (contract.lua's
-- diagnose): exit 137 and an oom event of this container since `since`
-- -> "oom"; docker's own failure status 125 with no daemon answering ->
-- "daemon", or with the image absent -> "image". What the container wrote
-- decides nothing (a worker may exit 125 or 137 itself: the daemon is asked).
function Driver:diagnose(_, c, exit, since)
  if exit == 137 then
    local res = self:exec({ "events", "--since", tostring(since), "--until", tostring(os.time() + 1),
      "--filter", "container=" .. c.name, "--filter", "event=oom", "--format", "{{.Action}}" },
      { max_stdout = M.MAX_RM_STDOUT, max_stderr = M.MAX_STDERR, kill_after_ms = M.INSPECT_TIMEOUT_MS })
    if not res.error and res.exit_status == 0 and (res.stdout or ""):find("oom", 1, true) then return "oom" end
    return nil
  end
  if exit == 125 or exit == nil then
    if not self:inspect_daemon() then return "daemon" end
    if not self:inspect_image(c.image) then return "image" end
  end
  return nil
end

-- True when the daemon has the image.
function Driver:inspect_image(image)
  local res = self:exec({ "image", "inspect", "--format", "{{.Id}}", image },
    { max_stdout = M.MAX_RM_STDOUT, max_stderr = M.MAX_STDERR, kill_after_ms = M.INSPECT_TIMEOUT_MS })
  return not res.error and res.exit_status == 0 and res.term_signal == 0
end

-- The runtimes the daemon has registered (shared/spec/warm-turns.md 4,
-- `sbx doctor`): {name = {path=, args=}} from `docker info --format
-- '{{json .Runtimes}}'`, or nil and inspect_daemon's reasons.
function Driver:runtimes()
  local res = self:exec({ "info", "--format", "{{json .Runtimes}}" },
    { max_stdout = M.MAX_RM_STDOUT, max_stderr = M.MAX_STDERR, kill_after_ms = M.INSPECT_TIMEOUT_MS })
  if res.error then return nil, res.code == "ENOENT" and "not found" or "cannot run" end
  if res.exit_status ~= 0 or res.term_signal ~= 0 then return nil, "no answer" end
  return contract.runtime_set(res.stdout)
end

-- Long-lived primitives of drivers/_lasting.lua (rich-mode.md 5.4) -------

-- One docker command within call_timeout_ms: its result when it exited 0
-- (or, with o.missing_ok, failed saying there is no such container: then
-- res.missing), else raises "docker <command> <name> failed with <exit>:
-- <first 300 characters of its stderr>" (or "failed: <why>" when it did
-- not start, was killed, or said more than its bounds).
function Driver:command(args, name, o)
  o = o or {}
  local max = o.max or M.MAX_ANSWER
  local res = self:exec(args, { max_stdout = max, max_stderr = o.max_stderr or M.MAX_RM_STDERR,
    kill_on_overflow = true, kill_after_ms = self.call_timeout_ms })
  local what = errors.RICH_DOCKER .. (o.verb or args[1]) .. " " .. name .. " failed"
  if res.error then fail(what .. ": " .. tostring(res.error)) end
  if res.timed_out then fail(what .. ": timeout") end
  if res.stdout_truncated or res.stderr_truncated then fail(what .. ": too large") end
  if res.term_signal ~= 0 then fail(what .. ": signal " .. tostring(res.term_signal)) end
  if res.exit_status == 0 then return res end
  if o.missing_ok and missing(res) then
    res.missing = true
    return res
  end
  fail(string.format("%s with %d: %s", what, res.exit_status, lasting.first_chars(res.stderr or "", M.TEXT_CHARS)))
end

-- The argv is made at create, with the env file's path; rendered once here
-- so what it refuses is refused before any command.
function Driver:render_lasting(spec, logcfg)
  return rich.render(spec, logcfg, function(s, l)
    rich.argv(s, l, "")
    return { spec = s, logcfg = l, env_file = rich.env_file(s) }
  end)
end

function Driver:inspect_container(name)
  local res = self:command({ "container", "inspect", "--", name }, name,
    { missing_ok = true, verb = "container inspect" })
  if res.missing then return nil end
  local v = json.decode(res.stdout)
  local facts = json.kind(v) == "array" and #v == 1 and lasting.facts(v[1]) or nil
  if not facts then fail(errors.RICH_DOCKER .. "container inspect " .. name .. " answered no container") end
  return facts
end

-- `docker create` with the environment in an env file: a new file of this
-- account (os.tmpname: mkstemp, mode 0600) that lives only for the command.
-- (Not /dev/stdin: the child's stdin is a socket, which that path cannot open.)
function Driver:create_lasting(r)
  local path
  local ok, err = pcall(function()
    local made, p = pcall(os.tmpname)
    if made then path = p end
    local f = path and io.open(path, "w")
    if not f or not f:write(r.rendered.env_file) or not f:close() then
      fail(errors.RICH_DOCKER .. "create " .. r.name .. " failed: cannot write its env file in /tmp")
    end
    self:command(rich.argv(r.rendered.spec, r.rendered.logcfg, path), r.name)
  end)
  if path then os.remove(path) end
  if not ok then error(err, 0) end
end

function Driver:start_lasting(name)
  self:command({ "start", "--", name }, name)
end

function Driver:remove_lasting(name)
  self:command({ "rm", "--force", "--", name }, name, { missing_ok = true })
end

-- `docker logs` writes the container's stdout and stderr to its own two:
-- the text is the stdout lines, then the stderr lines.
function Driver:lasting_logs(name, n)
  local res = self:command({ "logs", "--tail", tostring(n), "--", name }, name,
    { max = M.MAX_LOGS, max_stderr = M.MAX_LOGS, missing_ok = true })
  if res.missing then return "" end
  return res.stdout .. res.stderr
end

return setmetatable(M, { __call = function(_, opts) return M.new(opts) end })
