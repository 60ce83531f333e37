-- delegator/init.lua: the scoped delegator (spec fetch-and-delegation.md section 3).
--
-- A host tool lets a guest hand work to one fixed background target. The
-- delegator runs that work on the host's loop and reports back only to the
-- channel that asked, under the author the host bound. There is no owner or
-- agent dispatcher and no origin thread: a request names nothing but its
-- channel, target, author, title and task, and the host builds all of those
-- but the title and the task.
--
--   local d = delegator.new { target = "research", run = run, deliver = deliver, logger = log }
--   local job = d:start(request)  -- job record, or raises a DelegationError
--   d:running_channels()          -- one channel key per tracked job
--   d:idle()                      -- yields until the jobs tracked now settle
--   d:dispose()                   -- refuses new work, aborts all jobs, yields in idle()
--
-- Each job is a task on the one event loop (sandbox.async): it starts on the
-- next loop turn, gets its own signal (aborted by dispose() or by timeoutMs),
-- and stays tracked, keeping its channel's slot busy, until deliver(job,
-- outcome) has returned. Jobs are process-local: none survives a restart.
local async = require "sandbox.async"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local scrub = require "sandbox.delegator.scrub"
local signal = require "sandbox.signal"

local M = {}

-- Defaults and bounds (spec 3.1). The task limit is fixed.
M.DEFAULT_MAX_RUNNING = 2
M.MAX_RUNNING_MIN, M.MAX_RUNNING_MAX = 1, 10
M.DEFAULT_TIMEOUT_MS = 600000
M.TIMEOUT_MS_MIN, M.TIMEOUT_MS_MAX = 1000, 1200000
M.DEFAULT_MAX_TITLE_CHARS = 200
M.DEFAULT_MAX_REPORT_CHARS = 80000
M.DEFAULT_DIAGNOSTIC_CHARS = 600
M.MAX_TASK_CHARS = 4000

-- Constructor errors (plain Lua errors), from the one catalogue (sandbox/errors.lua).
M.E_BUDGET = errors.DELEGATION_BUDGET
M.E_TITLE_LIMIT = errors.DELEGATION_TITLE_LIMIT
M.E_REPORT_LIMIT = errors.DELEGATION_REPORT_LIMIT
M.E_DIAGNOSTIC_LIMIT = errors.DELEGATION_DIAGNOSTIC_LIMIT
M.E_CALLBACKS = errors.DELEGATION_CALLBACKS

-- Refusals of start() (DelegationError messages) and outcome texts.
M.E_SCOPE = errors.DELEGATION_SCOPE
M.E_UTF8 = errors.DELEGATION_UTF8
M.E_REQUIRED = errors.DELEGATION_REQUIRED
M.TIMED_OUT = "the worker ran out of time"
M.TASK_FAILED = "the task failed"
M.E_REPORT_TOO_LARGE = errors.DELEGATION_REPORT_TOO_LARGE
M.E_REPORT_UTF8 = errors.DELEGATION_REPORT_UTF8
M.LOG_DELIVER_FAILED = errors.DELEGATION_DELIVER_FAILED

local REQUEST_FIELDS = { channel = true, target = true, author = true, title = true, task = true }

local DelegationError = {
  __tostring = function(e) return e.message end,
}

local function refuse(message)
  error(setmetatable({ name = "DelegationError", message = message }, DelegationError), 0)
end

-- True for a DelegationError raised by start().
function M.is_delegation_error(e)
  return getmetatable(e) == DelegationError
end

local function fail(message) error(message, 0) end

-- An integer, or a float with an integral value, inside [lo, hi].
local function integral_in(v, lo, hi)
  if math.type(v) == "float" then
    if v ~= v or v ~= math.floor(v) or v == math.huge or v == -math.huge then return false end
  elseif math.type(v) ~= "integer" then
    return false
  end
  return v >= lo and v <= hi
end

local function limit_option(v, default, message)
  if v == nil then return default end
  if not scrub.valid_limit(v) then fail(message) end
  return v
end

local function non_empty_string(v)
  return type(v) == "string" and v ~= ""
end

-- A limit as operators write it: 200, not 200.0.
local function show(n)
  if math.type(n) == "float" and n == math.floor(n) and n < 2 ^ 63 then
    return tostring(math.tointeger(n))
  end
  return tostring(n)
end

local Delegator = {}
Delegator.__index = Delegator

-- new(opts) (exposed as sandbox.scoped_delegator): validates the options of
-- spec 3.1, in the order of its table; raises the message shown there.
function M.new(opts)
  if type(opts) ~= "table" then fail(M.E_BUDGET) end
  if not non_empty_string(opts.target) then fail(M.E_BUDGET) end
  local max_running = opts.maxRunning
  if max_running == nil then max_running = M.DEFAULT_MAX_RUNNING end
  if not integral_in(max_running, M.MAX_RUNNING_MIN, M.MAX_RUNNING_MAX) then fail(M.E_BUDGET) end
  local timeout_ms = opts.timeoutMs
  if timeout_ms == nil then timeout_ms = M.DEFAULT_TIMEOUT_MS end
  if not integral_in(timeout_ms, M.TIMEOUT_MS_MIN, M.TIMEOUT_MS_MAX) then fail(M.E_BUDGET) end
  local max_title = limit_option(opts.maxTitleChars, M.DEFAULT_MAX_TITLE_CHARS, M.E_TITLE_LIMIT)
  local max_report = limit_option(opts.maxReportChars, M.DEFAULT_MAX_REPORT_CHARS, M.E_REPORT_LIMIT)
  local diag = limit_option(opts.diagnosticChars, M.DEFAULT_DIAGNOSTIC_CHARS, M.E_DIAGNOSTIC_LIMIT)
  if type(opts.run) ~= "function" or type(opts.deliver) ~= "function"
    or type(opts.logger) ~= "table" or type(opts.logger.error) ~= "function" then
    fail(M.E_CALLBACKS)
  end
  return setmetatable({
    target = opts.target,
    max_running = math.tointeger(max_running),
    timeout_ms = math.tointeger(timeout_ms),
    max_title_chars = max_title,
    max_report_chars = max_report,
    diagnostic_chars = diag,
    _run = opts.run,
    _deliver = opts.deliver,
    _logger = opts.logger,
    _next_id = 1,
    _jobs = {},      -- tracked entries in start order: { job, channel, signal, done, waiters }
    _disposed = false,
  }, Delegator)
end
M.scoped_delegator = M.new

-- Check 1 of spec 3.2: everything the host binds.
local function in_scope(self, req)
  if self._disposed or type(req) ~= "table" then return false end
  for k in pairs(req) do
    if not REQUEST_FIELDS[k] then return false end
  end
  if req.target ~= self.target then return false end
  if not non_empty_string(req.channel) then return false end
  local a = req.author
  if type(a) ~= "table" then return false end
  if not non_empty_string(a.id) or type(a.name) ~= "string" then return false end
  if not non_empty_string(a.principalId) then return false end
  return a.tier == "member"
end

local function channel_count(self, channel)
  local n = 0
  for _, e in ipairs(self._jobs) do
    if e.channel == channel then n = n + 1 end
  end
  return n
end

-- The reason a raised value gives: its `message` field, or tostring.
local function reason_of(err)
  local ok, text = pcall(function()
    if type(err) == "table" and err.message ~= nil then return tostring(err.message) end
    return tostring(err)
  end)
  return ok and text or ""
end

local function outcome_of(self, sig, ok, value)
  if sig.aborted then return { ok = false, error = M.TIMED_OUT } end
  local reason
  if ok then
    if type(value) ~= "string" then
      reason = M.E_REPORT_TOO_LARGE
    else
      local n = utf8.len(value)
      if not n then
        reason = M.E_REPORT_UTF8
      elseif n > self.max_report_chars then
        reason = M.E_REPORT_TOO_LARGE
      else
        return { ok = true, report = value }
      end
    end
  else
    reason = reason_of(value)
  end
  local scrubbed = scrub.scrub_diagnostic(reason, self.diagnostic_chars)
  if scrubbed == "" then scrubbed = M.TASK_FAILED end
  return { ok = false, error = scrubbed }
end

local function copy_job(job)
  local a = job.author
  return {
    id = job.id, channel = job.channel, target = job.target,
    author = { principalId = a.principalId, id = a.id, name = a.name, tier = a.tier },
    title = job.title, task = job.task, startedAt = job.startedAt,
  }
end

local function settle(self, entry)
  for i, e in ipairs(self._jobs) do
    if e == entry then table.remove(self._jobs, i); break end
  end
  entry.done = true
  local waiters = entry.waiters
  entry.waiters = {}
  for _, w in ipairs(waiters) do w() end
end

-- The job's task: run, judge the outcome, deliver, untrack.
local function job_body(self, entry)
  local job, sig = entry.job, entry.signal
  local ctx = {
    channel = job.channel,
    author = { id = job.author.id, name = job.author.name, principalId = job.author.principalId },
    signal = sig,
  }
  local ok, value = pcall(self._run, job.task, ctx)
  if entry.timer then entry.timer:stop(); entry.timer = nil end
  local outcome = outcome_of(self, sig, ok, value)
  local delivered = pcall(self._deliver, copy_job(job), outcome)
  if not delivered then
    pcall(self._logger.error, M.LOG_DELIVER_FAILED, { channel = job.channel, job = job.id })
  end
end

-- start(request): the checks of spec 3.2 in order, then the job record of
-- 3.3. Never yields; the run begins on the next loop turn.
function Delegator:start(request)
  if not in_scope(self, request) then refuse(M.E_SCOPE) end
  local title, task = request.title, request.task
  if (type(title) == "string" and not utf8.len(title)) or (type(task) == "string" and not utf8.len(task)) then
    refuse(M.E_UTF8)
  end
  if type(title) ~= "string" or type(task) ~= "string" then refuse(M.E_REQUIRED) end
  local trimmed_title, trimmed_task = scrub.trim(title), scrub.trim(task)
  if trimmed_title == "" or trimmed_task == "" then refuse(M.E_REQUIRED) end
  local title_chars = utf8.len(title)
  if title_chars > self.max_title_chars then
    refuse(("the title is %d characters; keep it within %s"):format(title_chars, show(self.max_title_chars)))
  end
  local task_chars = utf8.len(trimmed_task)
  if task_chars > M.MAX_TASK_CHARS then
    refuse(("the task is %d characters; keep it within %d"):format(task_chars, M.MAX_TASK_CHARS))
  end
  local running = channel_count(self, request.channel)
  if running >= self.max_running then
    refuse(("this channel already has %d delegated tasks running; wait for one to report back"):format(running))
  end

  local a = request.author
  local job = {
    id = self._next_id,
    channel = request.channel,
    target = self.target,
    author = { principalId = a.principalId, id = a.id, name = a.name, tier = "member" },
    title = trimmed_title,
    task = trimmed_task,
    startedAt = os.time() * 1000,
  }
  self._next_id = self._next_id + 1
  local entry = { job = job, channel = job.channel, signal = signal.new(), done = false, waiters = {} }
  self._jobs[#self._jobs + 1] = entry
  entry.timer = core.timer(self.timeout_ms, function()
    entry.timer = nil
    entry.signal:abort("deadline")
  end)
  core.timer(0, function()
    local t = async.spawn(job_body, self, entry)
    async.on_done(t, function(done)
      if not done.ok then
        core.log("error", "sandbox delegator: job " .. tostring(job.id) .. " failed outside its callbacks")
      end
      settle(self, entry)
    end)
  end)
  return copy_job(job)
end

-- One channel key per tracked job, in start order (a channel with two jobs
-- appears twice), including jobs whose delivery is still pending.
function Delegator:running_channels()
  local out = {}
  for i, e in ipairs(self._jobs) do out[i] = e.channel end
  return out
end

-- Yields until every job tracked now has settled (delivered and untracked).
-- Jobs started later are not awaited. Must run inside a task when a job is
-- pending.
function Delegator:idle()
  local pending = {}
  for i, e in ipairs(self._jobs) do pending[i] = e end
  for _, e in ipairs(pending) do
    if not e.done then
      async.await(function(resume) e.waiters[#e.waiters + 1] = resume end)
    end
  end
end

-- Refuses any later start, aborts each tracked job's signal once, then waits
-- in idle(). No timeout of its own: a run that ignores ctx.signal keeps it
-- waiting. Calling it again is harmless.
function Delegator:dispose()
  self._disposed = true
  for _, e in ipairs(self._jobs) do
    e.signal:abort("disposed")
  end
  self:idle()
end

function Delegator:is_disposed()
  return self._disposed
end

return M
