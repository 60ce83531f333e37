-- drivers/contract.lua: what every container driver shares (spec/runtime.md
-- 4.1, 4.5-4.8, 6.3 step 1): the algorithm of one run (4.6) and of one
-- removal (4.7), written once over a few small driver primitives, plus the
-- limits, the error texts and the reply parser. A driver is a file of
-- primitives; the CLI driver (drivers/cli.lua) and the Engine API driver
-- (drivers/engine.lua) are two, and a warm-turn or Kubernetes driver is a
-- third file over the same contract, not a fork of the algorithm.
--
--   contract.run(d, spec, turn, signal, report) -> {ok=, text=[, truncated=true]}
--                                       4.6 (yields; raises 4.8). report (optional)
--                                       is filled with what the host observed, for
--                                       the turn record (sandbox/ops/record.lua):
--                                       running, replied, removing, removed
--                                       (core.now()), removal_failed, exit,
--                                       worker_reason (a reason of the
--                                       worker's own closed list it printed);
--                                       the metrics' container gauge reads
--                                       running/removing while the turn runs
--   contract.attached(d, c, input, signal, {max_stdout=, check=, report=}) -> stdout
--                                       4.6 for any checked spec and stdin bytes
--   contract.remove(d, name)            4.7 (yields; raises the cleanup error)
--   contract.list(d, installation)      6.3 step 1 (yields; raises the cleanup error)
--   contract.parse_reply(stdout)        4.6 step 9 / 8.4 -> {ok=, text=} (raises)
--   contract.local_endpoint(value)      4.5: DOCKER_HOST unset or unix://<absolute>
--
-- The long-lived lifecycle (rich-mode.md 5.1, 5.4), drivers/_lasting.lua:
--   contract.ensure_running(d, spec, logcfg, label)   keep or (re)create and start
--   contract.status(d, name, label) -> {state=, image=?, profile=?}
--   contract.remove_lasting(d, name)    forced, missing is fine (one call; raises
--                                       the driver's `docker ...` error)
--   contract.logs(d, name, lines) -> text
-- over the primitives render_lasting, inspect_container, create_lasting,
-- start_lasting, remove_lasting and lasting_logs (listed there). Both
-- built-in drivers have them; rich/docker.lua makes rich mode's driver
-- table of either.
--
-- The primitives a driver d provides (each yields; none raises for what the
-- daemon answered, only for a programming error):
--   d:create(c, signal) -> h        the container of the checked spec c
--                                   (drivers/_sealed.lua check) exists, or is
--                                   ready to be created by start (the CLI's
--                                   `docker run`); h.failed when the daemon
--                                   refused. From here on an abort of signal
--                                   ends everything h holds (4.6 step 4).
--   d:start(h, input, max_stdout)   start it attached and write input on its
--                                   stdin, then end of file (4.6 step 3, 5);
--                                   input nil: stdin stays open for d:feed
--   d:feed(h, input) -> boolean     a warm container's turn on its stdin,
--                                   then end of file (spec/warm-turns.md)
--   d:read(h) -> stdout, truncated  stdout until it ends, within max_stdout,
--                                   stderr drained within MAX_STDERR (either
--                                   limit: truncated); or nil, nil, err when
--                                   nothing could be started (4.8: the spawn
--                                   error; nothing to remove)
--   d:wait(h) -> exit | nil         the exit status; nil when unknown (a
--                                   failed wait, a death by signal)
--   d:wait_within(h, ms) -> exit | nil   the same, giving up (nil) after ms
--                                   (a warm turn's status after delivery)
--   d:release(h)                    drop the abort hook; kill and reap what is
--                                   left (4.6 step 10, first half)
--   d:remove_once(name) -> "ok" | "retry" | "fail"   one 4.7 attempt, bounded
--                                   by d.remove_timeout_ms
--   d:list_once(installation) -> {{name=, owner=}, ...} | nil   one 6.3 listing
-- Optional, for `sbx doctor` and `sbx demo`:
--   d:inspect_daemon() -> {version=, root=} | nil, "not found" | "cannot run"
--                                   | "permission denied" | "no answer"
--   d:inspect_image(image) -> boolean
--   d:runtimes() -> {name = {path=, args=}, ...} | nil, why   the daemon's
--                                   registered runtimes (shared/spec/warm-turns.md 4)
-- Optional, for the failure reasons of spec/operations.md 1 (what the host
-- sees, never what the container prints):
--   d:diagnose(h, c, exit, since) -> "oom" | "image" | "daemon" | nil
--                                   why a run with a non-zero exit failed: the
--                                   daemon's oom event for this container since
--                                   `since` (epoch seconds) with exit 137, the
--                                   daemon refusing or missing the image, or the
--                                   daemon not answering
-- A removal that fails while d:inspect_daemon() finds no daemon raises the
-- daemon error instead of the cleanup error (the removal could not be tried).
--
-- The steps are kept apart (create, start attached, read, wait, remove) so a
-- warm driver can create and start a container ahead of its turn, write the
-- turn later and deliver on stdout's end of file (spec/warm-turns.md).
local async = require "sandbox.async"
local container = require "sandbox.drivers._sealed"
local errors = require "sandbox.errors"
local core = require "sandbox.core"
local json = require "sandbox.json"
local lasting = require "sandbox.drivers._lasting"
local signal = require "sandbox.signal"

local M = {}

M.E_TOO_LARGE = errors.BODY_TOO_LARGE
M.E_WORKER = errors.WORKER
M.E_REPLY = errors.REPLY
M.E_CLEANUP = errors.CLEANUP
M.E_REMOTE = errors.REMOTE
M.E_OOM = errors.WORKER_OOM
M.E_IMAGE = errors.IMAGE_MISSING
M.E_DAEMON = errors.DAEMON

local DIAGNOSED = { oom = errors.WORKER_OOM, image = errors.IMAGE_MISSING, daemon = errors.DAEMON }

M.MAX_STDOUT = 2097152          -- 2 MiB
M.MAX_STDERR = 131072           -- 128 KiB
M.MAX_RM_STDERR = 16384         -- 16 KiB (CLI stderr, Engine API answer body)
M.MAX_LIST = 1048576            -- 1 MiB
M.MAX_TEXT_CHARS = 100000
M.REMOVE_TIMEOUT_MS = 5000
M.LIST_TIMEOUT_MS = 5000
M.REMOVE_ATTEMPTS = 3
M.SECOND_REMOVAL_DELAY_MS = 100

local function fail(msg) error(msg, 0) end

-- DOCKER_HOST unset/empty, or unix://<absolute path> (4.5).
function M.local_endpoint(value)
  if value == nil or value == "" then return true end
  local path = value:match("^unix://(/.*)$")
  return path ~= nil and not path:find("%z")
end

-- Inside a task: true once `task` finished within ms, false when ms passed
-- first (the task keeps running; the caller ends it).
function M.finished_within(task, ms)
  if task.done then return true end
  local timeout = signal.new()
  local timer = core.timer(ms, function() timeout:abort("timed out") end)
  local done = async.wait_or_abort(task, timeout)
  timer:stop()
  return done
end

-- The error a driver raises when its turn signal aborted.
function M.abort_reason(signal)
  local r = signal.reason
  if r == nil then r = "aborted" end
  return r
end

-- The reply object's members (spec/runtime.md 8.3; providers.md 3's
-- truncated; the reason a worker reports, operations.md 1, hardening.md 8).
M.REPLY_SHAPE = { ok = "boolean", text = "string", truncated = "boolean", reason = "string" }
M.MAX_REPLY_VALUES = 1024
-- What a worker that went on with its turn may report (hardening.md 8).
M.REPAIR_REASONS = { memory_store = true, history = true }

-- Reads the worker's stdout per 4.6 step 9 / 8.4 (shape-aware,
-- shared/spec/hardening.md 7): one object of the known members only, each
-- of its kind; an unknown member, a value of another kind or more than
-- MAX_REPLY_VALUES values is refused at its first byte, before anything of
-- it is built (a BOM or invalid UTF-8 never decodes). Returns {ok=, text=}
-- and, when the worker repaired a store, reason=; raises otherwise.
function M.parse_reply(stdout)
  local v = json.decode_shape(stdout, M.REPLY_SHAPE, M.MAX_REPLY_VALUES)
  if v == nil or type(v.ok) ~= "boolean" or type(v.text) ~= "string" then fail(M.E_REPLY) end
  local n = utf8.len(v.text)
  if not n or n > M.MAX_TEXT_CHARS then fail(M.E_REPLY) end
  local reason = v.reason
  if not M.REPAIR_REASONS[reason] then reason = nil end
  -- spec/providers.md 3: a reply cut at the provider's length limit says so
  return { ok = v.ok, text = v.text, truncated = v.ok and v.truncated == true or nil, reason = reason }
end

-- The reason a failed worker printed ({"ok":false,"reason":...}, the
-- worker's own closed list), or nil. Untrusted: the turn keeps it only
-- when nothing the host saw contradicts it (sandbox/ops/reason.lua). Read
-- shape-aware like any reply: a failed worker's stdout is no less hostile.
function M.worker_reason(stdout)
  if type(stdout) ~= "string" or #stdout > M.MAX_STDOUT then return nil end
  local v = json.decode_shape(stdout, M.REPLY_SHAPE, M.MAX_REPLY_VALUES)
  if v == nil or v.ok ~= false or type(v.reason) ~= "string" then return nil end
  return errors.WORKER_REASONS[v.reason] and v.reason or nil
end

-- The removal algorithm of 4.7 for one exact name; raises the cleanup error.
function M.remove(d, name)
  if type(name) ~= "string" or #name > 91 or not name:find("^[a-z0-9][a-z0-9_.%-]*$") then
    fail(M.E_CLEANUP)
  end
  for attempt = 1, M.REMOVE_ATTEMPTS do
    local r = d:remove_once(name)
    if r == "ok" then return end
    if r ~= "retry" or attempt == M.REMOVE_ATTEMPTS then break end
    async.sleep(100 * attempt)
  end
  fail(M.E_CLEANUP)
end

-- Every container (any state) labelled with this installation (6.3 step 1).
function M.list(d, installation)
  if type(installation) ~= "string" or not installation:find("^%x+$") then fail(M.E_CLEANUP) end
  local list = d:list_once(installation)
  if list == nil then fail(M.E_CLEANUP) end
  return list
end

-- 4.6 step 1 after the 4.2 checks: both labels present, then the turn's
-- stdin bytes (8.2, built by drivers/_sealed.lua).
local function input_of(spec, turn)
  local labels = spec.labels or {}
  for _, k in ipairs { container.LABEL_INSTALLATION, container.LABEL_OWNER } do
    if type(labels[k]) ~= "string" or labels[k] == "" then fail(errors.LABELS) end
  end
  return container.turn_json(turn)
end

-- Why a run with a non-zero exit failed, as the host sees it (the driver's
-- diagnose primitive): the error to raise.
local function failure_of(d, h, c, exit, since)
  local why = type(d.diagnose) == "function" and d:diagnose(h, c, exit, since) or nil
  return DIAGNOSED[why] or M.E_WORKER
end

-- Steps 7-8 once stdout was read and the exit status is known: the error of
-- a failed run, or nil.
local function outcome(d, h, c, signal, o, stdout, truncated, exit, since)
  local report = o.report or {}
  if truncated then return M.E_TOO_LARGE end                          -- 6
  if signal and signal.aborted then return M.abort_reason(signal) end -- 7
  if exit ~= 0 then                                                   -- 8
    report.worker_reason = M.worker_reason(stdout)
    return failure_of(d, h, c, exit, since)
  end
  return nil
end

-- Step 10: always, last; raises the removal's error (the daemon's when it
-- does not answer). `twice`: an aborted or failed run gets the second
-- removal after SECOND_REMOVAL_DELAY_MS.
local function removal(d, c, report, twice)
  report.removing = core.now()
  local removed, rerr = pcall(function()
    M.remove(d, c.name)
    if twice then
      async.sleep(M.SECOND_REMOVAL_DELAY_MS)
      M.remove(d, c.name)
    end
  end)
  report.removed = core.now()
  if not removed then
    report.removal_failed = true
    if type(d.inspect_daemon) == "function" and not d:inspect_daemon() then error(M.E_DAEMON, 0) end
    error(rerr, 0)
  end
end

-- Steps 3-5 without the wait for stdout: the container of the checked spec
-- c created and started attached, `input` on its stdin then end of file,
-- or, with input nil, its stdin left open for M.feed (a warm container,
-- spec/warm-turns.md: blocked on stdin until its turn). An abort of signal
-- from here on ends everything h holds. Returns h.
function M.launch(d, c, signal, input, max_stdout)
  local h = d:create(c, signal)
  d:start(h, input, max_stdout or M.MAX_STDOUT)
  return h
end

-- A warm container's turn on its stdin, then end of file. False when the
-- container was never started or its stdin is gone.
function M.feed(d, h, input)
  return d:feed(h, input) == true
end

-- One run of the checked spec c (drivers/_sealed.lua check) in a fresh
-- container, attached (4.6 steps 2-8 and 10): `input` on stdin, then stdout
-- once the container exited 0, within o.max_stdout bytes (default
-- MAX_STDOUT), handed to o.check (4.6 step 9) when given. Raises the abort
-- reason, `body too large`, `sandbox worker failed` (or, from what the
-- daemon says, the OOM, missing-image or daemon error), o.check's error or
-- the spawn error; a removal failure replaces any of them. o.report, when
-- given, gets what the host observed (see the header). The sealed turn and
-- the precheck runner (lua/sandbox/precheck/_docker.lua, its own stdout
-- bound and answer rules) are its two callers.
function M.attached(d, c, input, signal, o)
  o = o or {}
  local report = o.report or {}
  o.report = report
  if signal and signal.aborted then error(M.abort_reason(signal), 0) end  -- 2
  local since = os.time() - 1
  report.container = c.name
  local h = M.launch(d, c, signal, input, o.max_stdout)                 -- 3-5
  report.running = core.now()
  local stdout, truncated, unstarted = d:read(h)                        -- 6
  report.replied = core.now()
  if unstarted then                                                     -- nothing started,
    d:release(h)                                                        -- nothing to remove
    report.removed = core.now()
    error(unstarted, 0)
  end
  local exit = d:wait(h)
  d:release(h)
  report.exit = exit
  local ok, out = pcall(function()
    local err = outcome(d, h, c, signal, o, stdout, truncated, exit, since)
    if err then fail(err) end
    if o.check then return o.check(stdout) end                          -- 9
    return stdout
  end)
  -- 10: always, last. A removal failure replaces whatever came before.
  removal(d, c, report, (signal and signal.aborted) or exit ~= 0)
  if not ok then error(out, 0) end
  return out
end

-- A warm container's turn once M.feed wrote it (spec/warm-turns.md 3): its
-- stdout to end of file (`read`: a task of d:read(h) started at launch, so
-- a container lost before its turn is seen), then, when it parses as the
-- reply (o.check), the reply at once. Returns ok, the reply or the error,
-- and finish: what runs after delivery (the exit status collected, within
-- o.exit_wait_ms, then the removal of step 10; raises the removal's error;
-- a non-zero status with a good reply goes to o.on_fault(exit)). `since`:
-- the epoch second the container was launched (diagnose).
function M.deliver(d, h, c, signal, read, since, o)
  local report = o.report or {}
  local okr, stdout, truncated, unstarted = async.wait(read)
  report.replied = core.now()
  if not okr then stdout, truncated, unstarted = nil, nil, stdout end
  if unstarted then
    d:release(h)
    return false, unstarted, function() removal(d, c, report, true) end
  end
  local early_ok, early
  if not truncated and not (signal and signal.aborted) then
    early_ok, early = pcall(o.check, stdout)
  end
  if early_ok then
    return true, early, function()
      local exit = d:wait_within(h, o.exit_wait_ms)
      d:release(h)
      report.exit = exit
      if exit ~= 0 and o.on_fault then o.on_fault(exit) end
      removal(d, c, report, exit ~= 0)
    end
  end
  local exit = d:wait_within(h, o.exit_wait_ms)
  d:release(h)
  report.exit = exit
  local err = outcome(d, h, c, signal, o, stdout, truncated, exit, since) or early
  return false, err, function() removal(d, c, report, true) end
end

-- One turn in one fresh container (4.6). turn is the 8.2 turn (its table,
-- or its bytes).
function M.run(d, spec, turn, signal, report)
  local c = container.check(spec)                                      -- 1
  local input = input_of(spec, turn)
  return M.attached(d, c, input, signal, { check = M.parse_reply, report = report })
end

-- The daemon's Runtimes object (`docker info` JSON text, or GET /info's
-- decoded .Runtimes) as {name = {path=, args={...}}}, or nil, "no answer".
function M.runtime_set(v)
  if type(v) == "string" then v = json.decode(v) end
  if json.kind(v) ~= "object" then return nil, "no answer" end
  local set = {}
  for name, r in pairs(v) do
    if type(name) == "string" then
      local args = {}
      local list = type(r) == "table" and (r.runtimeArgs or r.RuntimeArgs) or nil
      if json.kind(list) == "array" then
        for _, a in ipairs(list) do if type(a) == "string" then args[#args + 1] = a end end
      end
      set[name] = { path = type(r) == "table" and type(r.path) == "string" and r.path or nil, args = args }
    end
  end
  return set
end

M.ensure_running = lasting.ensure_running
M.status = lasting.status
M.remove_lasting = lasting.remove
M.logs = lasting.logs

-- The driver methods of spec 4.1 for a driver class made of primitives:
-- run, remove and list over the contract; and the long-lived lifecycle's
-- ensure_running, status and logs.
function M.methods(Driver)
  function Driver:run(spec, turn, signal, report) return M.run(self, spec, turn, signal, report) end
  function Driver:remove(name) return M.remove(self, name) end
  function Driver:list(installation) return M.list(self, installation) end
  function Driver:ensure_running(spec, logcfg, label) return lasting.ensure_running(self, spec, logcfg, label) end
  function Driver:status(name, label) return lasting.status(self, name, label) end
  function Driver:logs(name, lines) return lasting.logs(self, name, lines) end
  return Driver
end

return M
