-- runtime/init.lua: the sealed runtime (spec/runtime.md sections 3.1, 5, 6.3, 7.4,
-- 7.5, 8.2). `sandbox.runtime{...}` checks its options and returns a runtime
-- that runs one turn per channel at a time:
--
--   rt:run_turn(channel, speaker, text) -> result   (yields)
--   rt:stop(channel) -> boolean      rt:busy() -> sorted channel keys
--   rt:start_fresh(channel)          rt:sweep() -> removed count (yields)
--   rt:dispose()                     (yields until every turn has settled)
--   rt:guest_turn(channel, speaker, text) -> the guest-visible text (5.7)
--   rt.logger                        the one operator logger (sandbox/log.lua)
--   rt.recorder                      the call and turn records (sandbox/ops/record.lua);
--                                    rt.recorder:subscribe(fn) adds a reader
--   rt:metrics() -> text             the Prometheus exposition (spec/operations.md 4,
--                                    sandbox/ops/metrics.lua, a reader of rt.recorder)
--   rt.metrics_registry              its metrics object (:containers_source, :queue_source)
--   rt:metrics_address() -> "127.0.0.1:PORT" | nil   where metricsListen serves GET /metrics
--
-- run_turn's result (spec/operations.md 1): every turn that was admitted and
-- set up ends with exactly one reason, decided by the host
-- (sandbox/ops/reason.lua):
--   {ok = true, text =, truncated = true?, reason = "ok", turn = <id>}
--   {ok = false, reason =, text = the worker's ok=false text or the guest text,
--    guest = the guest-visible text, error = the catalogue message (if one
--    was raised), fix =, turn =, route =, status =, code =, type =, param =
--    (upstream_status)}
-- It raises only for a turn that never started: the checks of 5.2 (busy,
-- invalid channel, principal, message, sizes) and the host's own setup
-- (the channel's workspace, the run directory, the broker socket, a turn
-- over 256 KiB); those are the caller's or the installation's to fix.
--
-- One turn: wait for the stale sweep, make sure the channel's workspace is a
-- service-owned directory, make a fresh 0700 turn dir under runRoot, serve a
-- broker bound to (channel, speaker, turn signal) on <turnDir>/broker.sock,
-- hand the driver the container spec and the turn object, then always stop
-- the broker, remove the turn dir and abort the turn signal, so nothing the
-- worker started outlives its turn. The runtime never queues: a second turn
-- on a busy channel is refused (the claim's channel queue orders them).
--
-- A hostile channel must not hurt the others (shared/spec/hardening.md):
-- a turn first takes its share of the host's descriptors (waiting in its
-- channel's queue while there is none: runtime/_descriptors.lua), then its
-- workspace must be within workspaceQuotaMb and the disk above diskReserveMb
-- (runtime/_disk.lua), whose watchdog stops a turn that fills the disk
-- meanwhile; a turn directory that cannot be removed for lack of
-- descriptors is retried by the next turn and by dispose.
--
-- Nothing here logs a payload, a credential, a URL or an exception text.
local async = require "sandbox.async"
local broker = require "sandbox.broker"
local budget = require "sandbox.broker._budget"
local channel_key = require "sandbox.channels._key"
local container = require "sandbox.drivers._sealed"
local contract = require "sandbox.drivers.contract"
local core = require "sandbox.core"
local descriptors = require "sandbox.runtime._descriptors"
local disk = require "sandbox.runtime._disk"
local errors = require "sandbox.errors"
local installation = require "sandbox.runtime._installation"
local lines = require "sandbox.ops.lines"
local log = require "sandbox.log"
local metrics = require "sandbox.ops.metrics"
local health = require "sandbox.ops.health"
local metrics_listen = require "sandbox.ops.metrics_listen"
local options = require "sandbox.runtime._options"
local reason = require "sandbox.ops.reason"
local record = require "sandbox.ops.record"
local reply_text = require "sandbox.channels._reply_text"
local signal = require "sandbox.signal"
local warm = require "sandbox.runtime._warm"

local M = {}

M.E_BUSY = errors.BUSY
M.E_CHANNEL = errors.CHANNEL
M.E_PRINCIPAL = errors.PRINCIPAL
M.E_MESSAGE = errors.MESSAGE
M.E_TOO_LARGE = errors.TOO_LARGE
M.E_WORKSPACE = errors.WORKSPACE
M.E_RUN_DIR = errors.RUN_DIR
M.E_REPLY = errors.REPLY
M.E_CLEANUP = errors.CLEANUP
M.E_LOCK = errors.LOCKED

M.TIMED_OUT = errors.TIMED_OUT
M.STOPPED = errors.STOPPED
M.SETTLED = "sandbox turn settled"

M.LOG_NOT_STARTED = "turn not started"
M.LOG_BUDGET_RAISED = "budget hook raised an error"
M.SETTLED_HOOK_MS = 10000
M.LOG_REFUSED = "turn refused"
M.GUEST_FAILED_OR_STOPPED = "The sandbox turn failed or was stopped."
M.GUEST_FAILED = "The sandbox turn failed."
M.GUEST_BUSY = "The sandbox is busy; try again shortly."
M.LOG_REPAIRED = "worker repaired a store"

M.E_WORKSPACE_QUOTA = errors.WORKSPACE_QUOTA
M.E_DISK_LOW = errors.DISK_LOW
M.E_HOST_DESCRIPTORS = errors.HOST_DESCRIPTORS

M.MAX_TEXT_CHARS = 32000
M.CLEANUP_RETRIES = 5
M.CLEANUP_RETRY_MS = 100
M.MAX_SPEAKER_CHARS = 256
M.MAX_TURN_BYTES = 262144

local DIR_MODE = tonumber("700", 8)

local function fail(msg) error(msg, 0) end

-- The errors of a turn that never started (see the header): raised.
local NOT_STARTED_NAMES = { WORKSPACE = true, RUN_DIR = true, BROKER_START = true,
  SOCKET_TOO_LONG = true, TOO_LARGE = true, TURN_ENCODING = true }
local function not_started(err)
  local e = errors.entry(err)
  return e ~= nil and NOT_STARTED_NAMES[e.name] == true
end

-- ---------------------------------------------------------------------------
-- Construction

local Runtime = {}
Runtime.__index = Runtime

-- opts: the options of spec/runtime.md 2.2. `checked` is internal: the
-- broker configuration sandbox{} already checked for these same options
-- (app:runtime_options), so construction does not check it a second time.
-- `host` (internal, optional): {log = function(level, msg, fields)}, an
-- embedding host's log, used when the options name no logger.
function M.new(opts, checked, host)
  local o = options.resolve(opts, checked)                          -- steps 1-14
  local cfg = o.broker_config
  local logger = log.from_options(o, host and host.log or nil)
  local recorder = record.recorder()
  recorder:subscribe(lines.reader(logger, { audit = o.audit }))
  local m = metrics.new()
  recorder:subscribe(m:reader())
  local mcp = {}
  for i, s in ipairs(cfg.server_list) do mcp[i] = { server = s.name, tools = s.tool_list } end
  local self = setmetatable({
    options = o, driver = o.driver, cfg = cfg, puid = core.getuid(),
    mcp = mcp,          -- the turn object's view of the MCP servers (8.2)
    active = {},        -- channel -> turn
    run_dirs = {},      -- turn dir name -> true while its turn runs
    resets = {},        -- channel -> pending start-fresh generation
    leftovers = {},     -- turn dirs a descriptor shortage kept; retried later
    disposed = false,
    logger = logger, recorder = recorder, metrics_registry = m,
  }, Runtime)
  self.watchdog = disk.watchdog(o)
  self.pool = warm.new(self)
  descriptors.raise(logger)
  m:containers_source(function() return self:_containers() end)
  self.lock = installation.lock(o.runRoot)                          -- step 15
  local ok, err = pcall(function()                                  -- step 16
    self.installation = installation.id(o.workspaceRoot, o.runRoot)
    self.owner = installation.owner_id()
    if o.metricsListen then                                         -- operations.md 4
      self.health = health.new(self:_health_facts())
      self.metrics_server = metrics_listen.serve(o.metricsListen, function() return m:render() end,
        function() return self.health:check() end)
    end
  end)
  if not ok then
    self.lock:release()
    error(err, 0)
  end
  local d = self.driver
  self.sweeps = type(d) == "table" and type(d.list) == "function" and type(d.remove) == "function"
  self.sweep_ok = not self.sweeps
  if self.sweeps then self:_start_sweep() end
  return self
end

-- ---------------------------------------------------------------------------
-- Stale sweep (spec/runtime.md 6.3; the algorithm is runtime/_installation.lua's)

function Runtime:_start_sweep()
  local task = async.spawn(function()
    local ok, removed = pcall(installation.sweep, {
      driver = self.driver, installation = self.installation, self = self.owner,
      run_root = self.options.runRoot, active = self.run_dirs, log = self.logger:fn(),
      daemon_down = function() return self:_cleanup_error() == errors.DAEMON end,
    })
    -- a daemon that does not answer is not a failed cleanup (its own reason)
    if ok or removed ~= errors.DAEMON then
      self.recorder:cleanup { ok = ok, scope = "sweep", removed = ok and removed or 0 }
    end
    if not ok then error(removed, 0) end
    self.sweep_ok = true
    return removed
  end)
  self.sweep_task = task
  return task
end

-- Joins a running sweep or starts one; returns how many containers it
-- removed, or raises the cleanup error.
function Runtime:sweep()
  if not self.sweeps then return 0 end
  local task = self.sweep_task
  if task == nil or task.done then task = self:_start_sweep() end
  local ok, res = async.wait(task)
  if not ok then fail(res == errors.DAEMON and errors.DAEMON or M.E_CLEANUP) end
  return res
end

-- §5.3 step 1: the sweep must have succeeded before a container starts; a
-- failed sweep is retried once by the turn.
function Runtime:_await_sweep(sig)
  if self.sweep_ok then return end
  local task = self.sweep_task
  if task and not task.done then async.wait_or_abort(task, sig) end
  if sig.aborted then fail(sig.reason) end
  if self.sweep_ok then return end
  task = self.sweep_task
  if task == nil or task.done then task = self:_start_sweep() end
  async.wait_or_abort(task, sig)
  if sig.aborted then fail(sig.reason) end
  if not self.sweep_ok then fail(self:_cleanup_error()) end
end

-- A failed sweep or removal: the daemon's own error when it does not answer
-- at all (the removal could not be tried), else the cleanup error.
function Runtime:_cleanup_error()
  local d = self.driver
  if type(d) == "table" and type(d.inspect_daemon) == "function" then
    local ok, info = pcall(d.inspect_daemon, d)
    if ok and not info then return errors.DAEMON end
  end
  return M.E_CLEANUP
end

-- ---------------------------------------------------------------------------
-- One turn

local function chars(s)
  return utf8.len(s)
end

-- Checks 1-5 of spec/runtime.md 5.2. Returns the speaker copy.
function Runtime:_admit(channel, speaker, text)
  if self.disposed or (type(channel) == "string" and self.active[channel]) then fail(M.E_BUSY) end
  if not channel_key.valid(channel) then fail(M.E_CHANNEL) end
  local principal = type(speaker) == "table" and speaker.principalId or nil
  if type(principal) ~= "string" or principal == "" then fail(M.E_PRINCIPAL) end
  local id, name = speaker.id, speaker.name
  if type(text) ~= "string" or type(id) ~= "string" or type(name) ~= "string" then fail(M.E_MESSAGE) end
  for _, s in ipairs { text, id, name, principal } do
    if not core.utf8_valid(s) then fail(M.E_MESSAGE) end
  end
  if id == "" then fail(M.E_MESSAGE) end
  if chars(text) > M.MAX_TEXT_CHARS or chars(id) > M.MAX_SPEAKER_CHARS
      or chars(name) > M.MAX_SPEAKER_CHARS or chars(principal) > M.MAX_SPEAKER_CHARS then
    fail(M.E_TOO_LARGE)
  end
  return { id = id, name = name, principalId = principal }
end

-- §5.3 step 3: the channel's workspace, created 0700 when missing; when
-- present a real directory (not a link) owned by the service user.
function Runtime:_workspace(channel)
  local dir = self.options.workspaceRoot .. "/" .. channel_key.segment(channel)
  local st = core.fs_lstat(dir)
  if not st then
    local made, _, code = core.fs_mkdir(dir, DIR_MODE)
    if not made and code ~= "EEXIST" then fail(M.E_WORKSPACE) end
    st = core.fs_lstat(dir)
  end
  if not st or st.type ~= "dir" or st.uid ~= self.puid then fail(M.E_WORKSPACE) end
  return dir
end

-- The ContainerSpec of spec/runtime.md 4.1.
function Runtime:_container_spec(turn, run_dir, workspace_dir)
  local o = self.options
  return {
    name = container.name(channel_key.segment(turn.channel)),
    image = o.image, runDir = run_dir, workspaceDir = workspace_dir, uid = o.uid, gid = o.gid,
    memoryMb = o.limits.memoryMb, cpus = o.limits.cpus, pids = o.limits.pids,
    labels = container.labels(self.installation, self.owner),
    seccompProfile = o.seccompProfile, runtime = o.runtime,
  }
end

-- The reply a turn returns: {ok, text} within maxReplyChars, mentions
-- neutralised unless mentions = "allow" (shared/spec/hardening.md 6). A
-- store the worker moved aside (hardening.md 8) is logged at warn.
function Runtime:_reply(turn, reply)
  local o = self.options
  if type(reply) ~= "table" or type(reply.ok) ~= "boolean" or type(reply.text) ~= "string" then
    fail(M.E_REPLY)
  end
  local n = utf8.len(reply.text)
  if not n or n > o.maxReplyChars then fail(M.E_REPLY) end
  if reply.reason ~= nil then
    local why = tostring(reply.reason)
    self.logger:warn(M.LOG_REPAIRED, { channel = turn.channel, turn = turn.record.turn, reason = why,
      fix = errors.reason_fix(why, self:fix_context()) })
  end
  local text = reply.text
  if o.mentions == "neutral" then text = reply_text.neutral_mentions(text) end
  -- §7.4: a good reply settles the reset (before cleanup)
  if reply.ok and (self.resets[turn.channel] or 0) == turn.snapshot then
    self.resets[turn.channel] = nil
  end
  return { ok = reply.ok, text = text, truncated = reply.ok and reply.truncated == true or nil }
end

-- §5.3 step 4: a fresh 0700 turn dir under runRoot, known to the sweep
-- while it exists (_remove_run_dir forgets it). Returns its path.
function Runtime:_new_run_dir()
  local run_dir = core.fs_mkdtemp(self.options.runRoot .. "/turn-XXXXXX")
  if not run_dir then fail(M.E_RUN_DIR) end
  self.run_dirs[run_dir:match("([^/]+)$")] = true
  return run_dir
end

-- 5.3 step 7: the turn of 8.2 and its stdin bytes, built once
-- (drivers/_sealed.lua); the limit applies to those bytes.
function Runtime:_turn_input(turn, text)
  local o = self.options
  local turn_obj, input = container.turn {
    text = text, speaker = turn.speaker, model = o.model, prompt = o.prompt, timeZone = o.timeZone,
    reset = turn.reset, tools = self.cfg.tool_list, mcp = self.mcp,
  }
  if #input > M.MAX_TURN_BYTES then fail(M.E_TOO_LARGE) end
  return turn_obj, input
end

-- Steps 4-10 of spec/runtime.md 5.3 once the workspace is known.
function Runtime:_in_run_dir(turn, text, workspace_dir)
  local sig, o = turn.signal, self.options
  local run_dir = self:_new_run_dir()
  local b
  local ok, res = pcall(function()
    local socket = run_dir .. "/broker.sock"
    if #socket > broker.MAX_SOCKET_PATH then fail(broker.SOCKET_TOO_LONG) end
    b = broker.bind(self.cfg, { apiKey = o.apiKey, budget = o.budget, channel = turn.channel, speaker = turn.speaker, signal = sig,
      recorder = self.recorder, turn = turn.record })
    local started, err = b:start(socket)
    if not started then fail(err == broker.SOCKET_TOO_LONG and err or errors.BROKER_START) end
    local turn_obj = self:_turn_input(turn, text)
    if sig.aborted then fail(sig.reason) end
    return self:_reply(turn, self.driver:run(self:_container_spec(turn, run_dir, workspace_dir), turn_obj,
      sig, turn.report))
  end)
  if b then b:stop() end
  self:_remove_run_dir(turn, run_dir)
  if not ok then error(res, 0) end
  return res
end

-- §5.3 step 10's removal of the run directory. A failure (a descriptor
-- shortage: the walk needs descriptors) is retried a few times, then left
-- to the next turn and to dispose (hardening.md 2). Either way the sweep
-- no longer counts it as a running turn's.
function Runtime:_remove_run_dir(turn, run_dir)
  local removed = core.fs_rmtree(run_dir)
  for _ = 1, M.CLEANUP_RETRIES do
    if removed then break end
    async.sleep(M.CLEANUP_RETRY_MS)
    removed = core.fs_rmtree(run_dir)
  end
  self.run_dirs[run_dir:match("([^/]+)$")] = nil
  if removed then return true end
  self.leftovers[run_dir] = true
  self.logger:error("a sandbox turn directory could not be removed; the next turn retries",
    { channel = turn.channel, turn = turn.record.turn })
  return false
end

function Runtime:_retry_leftovers()
  for dir in pairs(self.leftovers) do
    if core.fs_rmtree(dir) then self.leftovers[dir] = nil end
  end
end

-- A turn in the channel's warm container e (spec/warm-turns.md 3): bind
-- its broker, write the turn on its stdin, deliver the reply at stdout's end
-- of file; the container, broker and turn dir are removed afterwards by the
-- pool. Returns the reply, or nil when the container was gone before its
-- turn reached it (the turn then runs cold).
function Runtime:_warm_turn(turn, text, e)
  local sig, o, d = turn.signal, self.options, self.driver
  local ok, input = pcall(function()
    local _, bytes = self:_turn_input(turn, text)
    if sig.aborted then fail(sig.reason) end
    e.broker:bind { apiKey = o.apiKey, budget = o.budget, channel = turn.channel, speaker = turn.speaker, signal = sig,
      recorder = self.recorder, turn = turn.record }
    return bytes
  end)
  if not ok then
    self.pool:drop(e)
    error(input, 0)
  end
  local unlink = sig:on_abort(function(why) e.ws:abort(why) end)
  turn.entry = e
  turn.report.running = core.now()
  if not contract.feed(d, e.h, input) then
    unlink()
    turn.entry = nil
    self.logger:warn(warm.LOG_LOST, { channel = turn.channel, turn = turn.record.turn })
    self.pool:drop(e)
    return nil
  end
  local delivered, out, finish = contract.deliver(d, e.h, e.c, sig, e.read, e.since, {
    check = contract.parse_reply, report = turn.report, exit_wait_ms = warm.EXIT_WAIT_MS,
    on_fault = function(exit)
      self.logger:warn(warm.LOG_FAULT, { channel = turn.channel, turn = turn.record.turn, exit = exit })
    end,
  })
  unlink()
  self.pool:finish(e, finish, turn.workspace)
  if not delivered then fail(out) end
  return self:_reply(turn, out)
end

-- The turn's descriptor charge (hardening.md 2); a warm container of
-- another channel gives its charge back when none is left.
function Runtime:_charge(turn)
  local pool = self.pool
  descriptors.acquire(turn.signal, M.TIMED_OUT,
    pool.enabled and function() return pool:evict_other(turn.channel) end or nil)
  turn.charged = true
end

-- The budget hook's admission (broker/_budget.lua): a refusal, or a hook
-- that raised, refuses the turn before anything starts.
function Runtime:_budget_admission(turn)
  local hook = self.options.budget
  if not hook then return end
  local allowed, why = budget.allows(hook,
    budget.scope(turn.channel, turn.speaker, turn.record.turn, "admission", turn.record), turn.signal)
  if allowed then return end
  if why == "aborted" then fail(turn.signal.reason or M.STOPPED) end
  if why == "raised" then
    self.logger:error(M.LOG_BUDGET_RAISED, { channel = turn.channel, turn = turn.record.turn })
  end
  fail(errors.BUDGET_EXCEEDED)
end

-- The hook is told the settled turn's usage (its answer is ignored), in a
-- task of its own bounded by SETTLED_HOOK_MS: the reply never waits for it.
function Runtime:_budget_settled(turn)
  local hook = self.options.budget
  if not hook then return end
  local scope = budget.scope(turn.channel, turn.speaker, turn.record.turn, "settled", turn.record)
  async.spawn(function()
    local sig = signal.new()
    local timer = core.timer(M.SETTLED_HOOK_MS, function() sig:abort("deadline") end)
    local _, why = budget.allows(hook, scope, sig)
    timer:stop()
    if why == "raised" then
      self.logger:error(M.LOG_BUDGET_RAISED, { channel = turn.channel, turn = turn.record.turn })
    end
  end)
end

function Runtime:_turn(turn, text)
  local sig, pool = turn.signal, self.pool
  self:_budget_admission(turn)
  self:_await_sweep(sig)
  if sig.aborted then fail(sig.reason) end
  self:_retry_leftovers()
  -- a warm container is taken first (it holds its own charge), then every
  -- earlier container of the channel must be confirmed removed
  local e = pool.enabled and pool:take(turn.channel, sig) or nil
  local ok, err = pcall(function()
    if pool.enabled then pool:settle(turn.channel, sig) end
    if e then turn.report.warm = true else self:_charge(turn) end
    turn.workspace = self:_workspace(turn.channel)
    local start = disk.before_turn(self.options, turn.workspace)
    if sig.aborted then fail(sig.reason) end
    self.watchdog:add(turn, turn.workspace, start)
  end)
  if not ok then
    if e then pool:drop(e) end
    error(err, 0)
  end
  if e then
    local reply = self:_warm_turn(turn, text, e)
    if reply ~= nil then return reply end
    turn.report.warm = nil                    -- lost at the last moment: cold
    pool:settle(turn.channel, sig)
    self:_charge(turn)
  end
  return self:_in_run_dir(turn, text, turn.workspace)
end

-- The fix printed with a reason (errors.lua), with this installation's
-- names filled in.
function Runtime:fix_context()
  local o = self.options
  return { image = o.image, runRoot = o.runRoot, workspaceRoot = o.workspaceRoot,
           docker_host = os.getenv("DOCKER_HOST") }
end

local UPSTREAM = { upstream_status = true, upstream_unreachable = true, upstream_timeout = true,
  upstream_invalid = true, reflection = true }

-- The turn record's outcome and run_turn's result from what the turn
-- observed (ok, res: the pcall of the turn).
function Runtime:_settle(turn, ok, res)
  local t = turn.record
  local outcome = { error = not ok and res or nil, reply = ok and res or nil,
    aborted = turn.aborted, worker_reason = turn.report.worker_reason }
  t.reason = reason.decide(t, outcome)
  t.ok = t.reason == "ok"
  t.worker_reason = turn.report.worker_reason
  if not t.ok then
    t.error = outcome.error and errors.entry(outcome.error) and outcome.error or nil
    if UPSTREAM[t.reason] and t.last_model and t.last_model.reason == t.reason then
      t.upstream = t.last_model
    end
    t.fix = t.upstream and t.upstream.fix or errors.reason_fix(t.reason, self:fix_context())
  end
  self.recorder:turn_end(t, turn.report)
  if t.ok then
    return { ok = true, text = res.text, truncated = res.truncated, reason = "ok", turn = t.turn }
  end
  local up = t.upstream or {}
  return {
    ok = false, reason = t.reason, turn = t.turn, error = t.error, fix = t.fix,
    text = outcome.reply and outcome.reply.text or M.GUEST_FAILED_OR_STOPPED,
    guest = outcome.reply and M.GUEST_FAILED or M.GUEST_FAILED_OR_STOPPED,
    route = up.route, status = up.upstream_status, code = up.code, type = up.type, param = up.param,
    cause = up.cause, request_id = up.request_id,
  }
end

function Runtime:run_turn(channel, speaker, text)
  local who = self:_admit(channel, speaker, text)                   -- checks 1-5
  local turn = { channel = channel, signal = signal.new(), waiters = {}, report = {} }
  turn.record = self.recorder:turn_begin(channel)
  turn.timer = core.timer(self.options.turnTimeoutMs, function()          -- 6
    turn.signal:abort(M.TIMED_OUT)
  end)
  turn.snapshot = self.resets[channel] or 0                         -- 7
  turn.reset = turn.snapshot > 0
  turn.speaker = who                                                -- 8
  self.active[channel] = turn                                       -- 9
  local ok, res = pcall(self._turn, self, turn, text)
  if not ok and res == signal.AbortError then res = turn.signal.reason or M.STOPPED end
  self.watchdog:remove(turn)
  if turn.charged then descriptors.release() end
  -- a deadline or a stop the host itself saw decides a failed turn's reason
  -- even when a driver still answered after it (5.4)
  turn.aborted = turn.signal.aborted and turn.signal.reason or nil
  turn.signal:abort(M.SETTLED)                                      -- 5.3 step 11
  turn.timer:stop()
  self.active[channel] = nil
  local waiters = turn.waiters
  turn.waiters = nil
  for _, w in ipairs(waiters) do w() end
  if not ok and not_started(res) then
    self.logger:error(M.LOG_NOT_STARTED, { channel = channel, turn = turn.record.turn, error = res,
      fix = errors.fix(res, self:fix_context()) })
    error(res, 0)
  end
  local result = self:_settle(turn, ok, res)
  self:_budget_settled(turn)
  self:_after_turn(turn, result.reason)
  return result
end

-- Turns whose failure came from the sandbox itself (its container, the
-- daemon, the host's budgets): the channel's next turn runs cold, so a
-- hostile or broken worker never has a container waiting for it.
local NO_WARM_AFTER = { invalid_turn = true, worker_failed = true, worker_oom = true, invalid_reply = true,
  deadline = true, stopped = true, cleanup_failed = true, daemon_unavailable = true, workspace_quota = true,
  disk_low = true, queue_full = true, host_descriptors = true, state_write_failed = true, image_missing = true }

-- spec/warm-turns.md 2: after a turn settled, the channel's next container
-- (a cold turn's now; a warm turn's once its container is removed, by
-- pool:finish). A cold removal that failed blocks the channel instead.
function Runtime:_after_turn(turn, why)
  if not turn.workspace then return end
  local again = not NO_WARM_AFTER[why]
  if turn.entry then
    turn.entry.no_refill = not again
  elseif turn.report.removal_failed then
    self.pool:blocked_by(turn.channel, turn.report.container)
  elseif again then
    self.pool:refill_soon(turn.channel, turn.workspace)
  end
end

-- The guest-facing wrapper of spec/runtime.md 5.7 (what the claim and
-- `sbx chat` send): the worker text when ok, `The sandbox turn failed.` for
-- an ok=false reply, `The sandbox turn failed or was stopped.` for any other
-- failure. The turn's own line (`turn finished`, spec/operations.md 2) says
-- why; a turn refused before it started gets one line with the catalogue
-- message. Returns the text and run_turn's outcome (true, result | false,
-- the raised error).
function Runtime:guest_turn(channel, speaker, text)
  local ok, res = pcall(self.run_turn, self, channel, speaker, text)
  if not ok then
    if not not_started(res) then
      self.logger:error(M.LOG_REFUSED, { channel = type(channel) == "string" and channel or "?",
        error = errors.safe_to_show(res) and res or "unexpected error" })
    end
    return M.GUEST_FAILED_OR_STOPPED, false, res
  end
  if res.ok then return res.text, true, res end
  return res.guest, true, res
end

-- The channel's warm container removed (its mode turned off); its next
-- turn runs cold.
function Runtime:cool(channel)
  self.pool:cool(channel)
end

function Runtime:stop(channel)
  local turn = type(channel) == "string" and self.active[channel] or nil
  if not turn then return false end
  turn.signal:abort(M.STOPPED)
  return true
end

-- The containers of the running turns, by state, from what each turn's
-- driver reported so far (drivers/contract.lua): running from start until
-- removal begins, removing until it ended. The metrics' sbx_containers
-- reads it at scrape time.
function Runtime:_containers()
  local running, removing = 0, 0
  for _, turn in pairs(self.active) do
    local r = turn.report
    if r.running and not r.removing and not r.removed then running = running + 1
    elseif r.removing and not r.removed then removing = removing + 1 end
  end
  local pool = self.pool:counts()
  return { running = running, removing = removing + pool.removing, warm = pool.warm }
end

-- The Prometheus text exposition of this runtime (spec/operations.md 4).
function Runtime:metrics()
  return self.metrics_registry:render()
end

-- The readiness checks /readyz runs (ops/health.lua): the daemon answers,
-- the image is there, both roots take a file, a turn's descriptors fit.
function Runtime:_health_facts()
  local o, d = self.options, self.driver
  local function has(name) return type(d) == "table" and type(d[name]) == "function" end
  return {
    daemon = has("inspect_daemon") and function()
      local info = d:inspect_daemon()
      if not info then return false, errors.DAEMON, errors.reason_fix("daemon_unavailable") end
      return true, "answers" .. (info.version and (" (" .. info.version .. ")") or "")
    end or nil,
    image = has("inspect_image") and function()
      if not d:inspect_image(o.image) then
        return false, o.image .. " is missing", errors.reason_fix("image_missing", self:fix_context())
      end
      return true, o.image
    end or nil,
    writable = function()
      for _, dir in ipairs { o.runRoot, o.workspaceRoot } do
        if not health.writable(dir) then
          return false, dir .. " is not writable", "give the service account its 0700 root back"
        end
      end
      return true, "runRoot and workspaceRoot"
    end,
    descriptors = function()
      local ok, free, limit = health.descriptor_room()
      if not ok then
        return false, string.format("%d of %d free, a turn needs %d", free, limit, health.PER_TURN),
          "raise the service's LimitNOFILE, or run fewer channels at once"
      end
      return true, string.format("%d of %d free", free, limit)
    end,
  }
end

-- "HOST:PORT" where metricsListen serves, nil when it is not set.
function Runtime:metrics_address()
  local srv = self.metrics_server
  if not srv or not srv:port() then return nil end
  return srv:host() .. ":" .. srv:port()
end

function Runtime:busy()
  local list = {}
  for k in pairs(self.active) do list[#list + 1] = k end
  table.sort(list)
  return list
end

-- §7.4: the next turn of `channel` that settles ok=true after this call
-- starts fresh.
function Runtime:start_fresh(channel)
  if not channel_key.valid(channel) then fail(M.E_CHANNEL) end
  self.resets[channel] = (self.resets[channel] or 0) + 1
end

local function wait_turn(turn)
  if turn.waiters == nil then return end
  async.await(function(resume) turn.waiters[#turn.waiters + 1] = resume end)
end

-- Marks the runtime closed, aborts every active turn and waits until all have
-- settled and a running sweep has finished; then releases the lock.
-- Idempotent: a second call waits for the same settlement. Returns the
-- settlement task (done once the lock is released).
function Runtime:dispose()
  if not self.dispose_task then
    self.disposed = true
    for _, turn in pairs(self.active) do turn.signal:abort(M.STOPPED) end
    self.dispose_task = async.spawn(function()
      while next(self.active) do
        local _, turn = next(self.active)
        wait_turn(turn)
      end
      local sweep = self.sweep_task
      if sweep and not sweep.done then async.wait(sweep) end
      self.pool:dispose()
      self:_retry_leftovers()
      self.watchdog:stop()
      if self.metrics_server then self.metrics_server:close() end
      self.lock:release()
      self.lock = nil
    end)
  end
  -- Outside a task (a signal handler, a plain script) there is nothing to
  -- yield: the settlement then completes on the loop without us waiting.
  if not self.dispose_task.done and coroutine.isyieldable() then async.wait(self.dispose_task) end
  return self.dispose_task
end

M.Runtime = Runtime

return setmetatable(M, { __call = function(_, opts) return M.new(opts) end })
