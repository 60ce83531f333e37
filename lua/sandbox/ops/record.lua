-- ops/record.lua: the one record per broker call and the one record per turn
-- (spec/operations.md 1-4). They are the single source of every operator
-- output about a turn: the operator log's per-turn lines and the broker's
-- payload-free audit lines (ops/lines.lua), the turn's reason and fix in
-- rt:run_turn's result, `sbx run` and the Bun bridge, and the Prometheus
-- metrics of operations.md 4 (ops/metrics.lua: counters by reason, route
-- kind and status, the phase histograms). Those are READERS of these
-- records, subscribed with recorder:subscribe(fn): they never change the
-- code that fills them.
--
--   local record = require "sandbox.ops.record"
--   local rec = record.recorder()              -- one per runtime (or broker)
--   rec:subscribe(function(r) ... end)         -- r.kind: "turn_started", "call", "turn", "precheck", "cleanup"
--   local t = rec:turn_begin("discord:1")      -- admission
--   rec:call(t, c)                             -- a settled broker call
--   rec:turn_end(t)                            -- the turn's outcome is set
--   local r = rec:run_begin(channel, schedule) -- a precheck run; rec:run_end(r)
--   rec:cleanup { ok = false, scope = "sweep" } -- a removal outside a turn (the stale sweep)
--
-- A call record (the broker fills it; record.call makes the skeleton):
--   kind = "call", channel, turn (the turn id), route (the path matched, nil
--   when none did), route_kind ("model" | "tools" | "mcp" | "other"),
--   accepted (step 9 passed), status (what the guest got; 0 = nothing was
--   written), reason (nil = ok; a refusal reason of operations.md 3, or the
--   turn reason of an accepted call that failed: upstream_status,
--   upstream_unreachable, upstream_timeout, upstream_invalid, reflection,
--   credential_missing, credential_error, tool_failed, request_deadline,
--   client_closed, stopped), header (a refused header's name), ms,
--   upstream_status, code, type, param (providers.md 4 tokens), fix,
--   upstream_ms (the time of the upstream request, when one was sent),
--   bytes_in, bytes_out, and for a /model 200: reply = {message = the first
--   choice holds a message object, finish = its finish_reason (a known value
--   or "other"), tool_calls = it asks for tools} (facts the host checks the
--   worker's own reason against; never text).
-- A turn record:
--   kind = "turn", channel, turn, started (core.now() at admission), ok,
--   reason (operations.md 1), error (the catalogue message, nil when ok),
--   fix, exit (the worker's exit status, when known), ms, model_calls,
--   tool_calls, mcp_calls, refused_calls, tool_failures, ms_start (admission
--   to container running), ms_first_call, ms_reply (stdout ended),
--   ms_removed, removal_failed (true when its container's removal failed),
--   worker_reason (what the worker claimed, whether kept or not),
--   last_model (the last /model call record), upstream (the call record an
--   upstream reason came from: its route, status and tokens).
-- A cleanup record: kind = "cleanup", ok, scope ("sweep": the stale sweep
-- of runtime.md 6.3; "warm": a warm container, spec/warm-turns.md),
-- removed (how many containers it removed).
-- Timings are milliseconds of core.now(); counters only count. Nothing in a
-- record is a payload: no body, header value, credential, URL path, guest
-- text or exception text.
local core = require "sandbox.core"

local M = {}

M.ROUTE_KINDS = { model = true, tools = true, mcp = true, other = true }

-- A fresh turn id: 16 lowercase hex characters.
function M.turn_id()
  return assert(core.random_hex(8))
end

-- A call record's skeleton.
function M.call(channel, turn, route, kind)
  return {
    kind = "call", channel = channel, turn = turn, route = route,
    route_kind = M.ROUTE_KINDS[kind] and kind or "other",
    accepted = false, status = 0, started = core.now(),
  }
end

local Recorder = {}
Recorder.__index = Recorder

function M.recorder()
  return setmetatable({ readers = {} }, Recorder)
end

-- Adds a reader: fn(record) for every settled call and every finished turn,
-- in that order. A reader that raises loses that record only.
function Recorder:subscribe(fn)
  self.readers[#self.readers + 1] = fn
  return fn
end

function Recorder:_emit(r)
  for _, fn in ipairs(self.readers) do pcall(fn, r) end
end

-- A record whose counters the calls move (Recorder:call): a turn's or a
-- precheck run's.
local function counting(kind, channel, id)
  return {
    kind = kind, channel = channel, turn = id or M.turn_id(), started = core.now(),
    model_calls = 0, tool_calls = 0, mcp_calls = 0, refused_calls = 0, tool_failures = 0,
    tokens_in = 0, tokens_out = 0, tokens_cached = 0, tokens_reasoning = 0,
  }
end

-- A new turn record at admission; readers get {kind = "turn_started",
-- channel, turn, record = t} (the `turn started` line, a running gauge).
function Recorder:turn_begin(channel, id)
  local t = counting("turn", channel, id)
  self:_emit { kind = "turn_started", channel = channel, turn = t.turn, record = t }
  return t
end

-- The turn's counters and facts from one settled call, then the readers.
-- t may be nil (a broker outside a runtime turn: `sbx broker`).
function Recorder:call(t, c)
  if c.ms == nil and c.started then c.ms = core.now() - c.started end
  if t then
    if c.accepted then
      if c.route_kind == "model" then t.model_calls = t.model_calls + 1
      elseif c.route_kind == "tools" then t.tool_calls = t.tool_calls + 1
      elseif c.route_kind == "mcp" then t.mcp_calls = t.mcp_calls + 1 end
      if t.first_call == nil then t.first_call = c.started end
    end
    if c.status ~= 200 and c.reason ~= "tool_failed" then t.refused_calls = t.refused_calls + 1 end
    if c.reason == "tool_failed" then t.tool_failures = t.tool_failures + 1 end
    if c.route_kind == "model" then t.last_model = c end
    local u = c.usage
    if u then
      t.tokens_in = t.tokens_in + (u.input or 0)
      t.tokens_out = t.tokens_out + (u.output or 0)
      t.tokens_cached = t.tokens_cached + (u.cached or 0)
      t.tokens_reasoning = t.tokens_reasoning + (u.reasoning or 0)
    end
  end
  self:_emit(c)
end

-- Phase timings from the driver's report (runtime/init.lua passes it), then
-- the readers. t.reason and t.ok are set by the caller (ops/reason.lua).
function Recorder:turn_end(t, report)
  local now = core.now()
  report = report or {}
  local function since(at) return at and at - t.started or nil end
  t.ms = now - t.started
  t.exit = report.exit
  t.ms_start = since(report.running)
  t.ms_first_call = since(t.first_call)
  t.ms_reply = since(report.replied)
  t.ms_removed = since(report.removed)
  t.removal_failed = report.removal_failed
  t.warm = report.warm == true or nil     -- ran in a warm container (spec/warm-turns.md)
  self:_emit(t)
end

-- A precheck run's record (lua/sandbox/precheck/_run.lua): the same
-- counters as a turn's, moved by its broker's calls; readers get
-- {kind = "precheck", channel, turn (the run id), schedule, ok, reason,
-- fix, ms, mcp_calls, refused_calls} once the run settled (its container
-- removed). reason: ok, script_error (the script answered an error: its
-- text is the core's, never logged), or a turn reason of operations.md 1
-- (deadline, stopped, invalid_reply, cleanup_failed, daemon_unavailable,
-- image_missing, worker_failed).
function Recorder:run_begin(channel, schedule)
  local r = counting("precheck", channel)
  r.schedule = schedule
  return r
end

function Recorder:run_end(t)
  t.ms = core.now() - t.started
  self:_emit(t)
end

-- A removal outside a turn settled: c = {ok = boolean, scope = "sweep" |
-- "warm", removed = n}; the readers get it as kind = "cleanup".
function Recorder:cleanup(c)
  self:_emit { kind = "cleanup", ok = c.ok == true, scope = c.scope, removed = c.removed }
end

return M
