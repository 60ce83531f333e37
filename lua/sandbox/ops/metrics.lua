-- ops/metrics.lua: the engine's Prometheus metrics (spec/operations.md 4).
-- One per runtime (rt.metrics_registry; rt:metrics() renders it). The
-- counters and histograms are a READER of the call and turn records of
-- ops/record.lua, subscribed beside the operator log's reader
-- (ops/lines.lua), so a metric moves exactly when, and by what, the log
-- line about the same call or turn says; nothing here is a second
-- bookkeeping of a turn. The gauges are read at scrape time
-- from sources that own the live state (the runtime's active turns, the
-- channel queue, and the warm pool of runtime/_warm.lua).
--
--   local metrics = require "sandbox.ops.metrics"
--   local m = metrics.new()
--   recorder:subscribe(m:reader())
--   m:containers_source(function() return { running = n } end)   -- -> handle; handle:remove()
--   m:queue_source(function() return waiting end)               -- -> handle
--   m:render() -> the text exposition (0.0.4), m.CONTENT_TYPE
--   m.registry                                                  -- ops/exposition.lua, for more families
--
-- The families, and where each value comes from:
--   sbx_turns_total{mode,reason}                  counter   turn record: reason (the closed set of
--                                                           operations.md 1, every one exposed from 0);
--                                                           mode only on rich turns and precheck runs
--                                                           (record.mode, kind = "precheck")
--   sbx_turn_duration_seconds{mode}               histogram turn record: ms (mode as above)
--   sbx_turn_phase_seconds{phase}                 histogram turn record: ms_start, ms_first_call,
--                                                           ms_reply, ms_removed (phase = start,
--                                                           first_call, reply, removed: seconds from
--                                                           admission, as the `turn finished` line)
--   sbx_broker_requests_total{route_kind,status}  counter   call record: route_kind (model, tools,
--                                                           mcp, other), status (the HTTP status the
--                                                           caller got, "none" when nothing was written)
--   sbx_broker_refusals_total{reason}             counter   call record: reason, when it is a refusal
--                                                           of operations.md 3 (ops/lines.lua REFUSALS,
--                                                           every one exposed from 0)
--   sbx_upstream_responses_total{route_kind,status} counter call record: upstream_status (model, mcp)
--   sbx_upstream_duration_seconds{route_kind}     histogram call record: upstream_ms
--   sbx_reflection_refusals_total                 counter   call record: reason = reflection
--   sbx_upstream_retries_total{route_kind}        counter   call record: tries - 1 (broker/_retry.lua)
--   sbx_build_info{version}, process_*             gauge     ops/process.lua (the release, the process)
--   sbx_model_tokens_total{direction}            counter   call record: usage (providers/: input, output,
--                                                           cached, reasoning, as the provider reported)
--   sbx_containers{state}                         gauge     running, warm, removing (always all three)
--   sbx_channel_queue_depth                       gauge     turns waiting behind a channel's running one
--   sbx_cleanup_failures_total                    counter   turn record: removal_failed; cleanup
--                                                           records (kind = "cleanup", ok = false:
--                                                           the stale sweep, later the warm pool)
-- Label values are only ever the closed sets above: never a channel, a
-- speaker, a tool or server name, a URL, a credential or any payload.
--
-- Warm turns (spec/warm-turns.md, runtime/_warm.lua): the runtime's one
-- containers source adds the pool's counts (warm = waiting or starting,
-- removing = removals still running after delivery or eviction); a failed
-- removal of a warm container is rt.recorder:cleanup { ok = false, scope =
-- "warm" }, and the unbound broker's `not_bound` refusals arrive through
-- the broker's call records like every other refusal.
local errors = require "sandbox.errors"
local exposition = require "sandbox.ops.exposition"
local lines = require "sandbox.ops.lines"
local process = require "sandbox.ops.process"
local record = require "sandbox.ops.record"

local M = {}

M.CONTENT_TYPE = exposition.CONTENT_TYPE

-- Seconds. A turn lasts at most 600 s (turnTimeoutMs), an upstream call at
-- most the 60 s call deadline.
M.TURN_BUCKETS = { 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600 }
M.UPSTREAM_BUCKETS = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60 }

-- phase label -> the turn record's field (spec/operations.md 2)
M.PHASES = { { "start", "ms_start" }, { "first_call", "ms_first_call" }, { "reply", "ms_reply" },
  { "removed", "ms_removed" } }
M.CONTAINER_STATES = { "running", "warm", "removing" }

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

-- The modes whose turns count here (one registry type, one reader, for
-- every mode): a sealed turn's series carry no mode label (as they always
-- did); a rich turn's and a precheck run's carry mode="rich" /
-- mode="precheck", with the same reasons and the same families.
M.MODES = { "sealed", "rich", "precheck" }
local MODE_SET = set_of(M.MODES)
local function mode_label(v)
  if v == nil or v == "sealed" then return false end
  return MODE_SET[v] and v or nil
end

local REASONS = {}
for _, r in ipairs(errors.reasons) do REASONS[r.reason] = true end

-- The reasons a mode can end with, each exposed from 0 in a registry made
-- for that mode (errors.reasons: `modes` absent = sealed and rich;
-- precheck: errors.PRECHECK_REASONS).
function M.reasons_of(mode)
  if mode == "precheck" then return errors.PRECHECK_REASONS end
  local out = {}
  for _, r in ipairs(errors.reasons) do
    local modes = r.modes or { sealed = true, rich = true }
    if modes[mode or "sealed"] then out[#out + 1] = r.reason end
  end
  return out
end
M.TOKEN_DIRECTIONS = { "input", "output", "cached", "reasoning" }
M.TOKEN_DIRECTIONS_SET = {}
for _, d in ipairs(M.TOKEN_DIRECTIONS) do M.TOKEN_DIRECTIONS_SET[d] = true end
local PHASE_SET = {}
for _, p in ipairs(M.PHASES) do PHASE_SET[p[1]] = true end
local STATES = set_of(M.CONTAINER_STATES)
local UPSTREAM_KINDS = { model = true, mcp = true }

-- An HTTP status as a label: "100".."599", or "none" for 0 (nothing was
-- written); anything else is not exposed.
local function status_label(v)
  if v == 0 then return "none" end
  if math.type(v) == "integer" and v >= 100 and v <= 599 then return tostring(v) end
  return nil
end

local function seconds(ms)
  return type(ms) == "number" and ms / 1000 or nil
end

local Metrics = {}
Metrics.__index = Metrics

-- opts.mode ("sealed" default, "rich", "precheck"): the mode whose reasons
-- are exposed from 0; :add_mode(mode) exposes another's (one registry for
-- a host that runs several modes).
function M.new(opts)
  local reg = exposition.registry()
  local self = setmetatable({ registry = reg, container_sources = {}, queue_sources = {} }, Metrics)
  self.turns = reg:counter("sbx_turns_total",
    "Turns that ended, by failure reason (ok when one succeeded); rich turns and precheck runs carry their mode.",
    { reason = REASONS, mode = mode_label })
  self.turn_seconds = reg:histogram("sbx_turn_duration_seconds",
    "Time from a turn's admission to its end, in seconds.", { mode = mode_label }, M.TURN_BUCKETS)
  self:add_mode(opts and opts.mode or "sealed")
  self.phase_seconds = reg:histogram("sbx_turn_phase_seconds",
    "Time from a turn's admission to each phase (start: container running, first_call, reply: stdout ended, removed), in seconds.",
    { phase = PHASE_SET }, M.TURN_BUCKETS)
  self.requests = reg:counter("sbx_broker_requests_total",
    "Broker requests, by route kind and the HTTP status the caller got (none: nothing was written).",
    { route_kind = record.ROUTE_KINDS, status = status_label })
  self.refusals = reg:counter("sbx_broker_refusals_total", "Broker requests refused, by refusal reason.",
    { reason = lines.REFUSALS })
  local refusal_names = {}
  for r in pairs(lines.REFUSALS) do refusal_names[#refusal_names + 1] = r end
  for _, r in ipairs(refusal_names) do self.refusals:init { reason = r } end
  self.upstream = reg:counter("sbx_upstream_responses_total",
    "Upstream responses to broker calls, by route kind and upstream HTTP status.",
    { route_kind = UPSTREAM_KINDS, status = status_label })
  self.upstream_seconds = reg:histogram("sbx_upstream_duration_seconds",
    "Time of one upstream request of a broker call, in seconds.", { route_kind = UPSTREAM_KINDS }, M.UPSTREAM_BUCKETS)
  self.tokens = reg:counter("sbx_model_tokens_total",
    "Model tokens the providers reported, by direction (input, output; cached: of the input, read from a cache; reasoning: of the output).",
    { direction = M.TOKEN_DIRECTIONS_SET })
  for _, d in ipairs(M.TOKEN_DIRECTIONS) do self.tokens:init { direction = d } end
  self.retries = reg:counter("sbx_upstream_retries_total",
    "Upstream requests tried again by the host's retry policy (429, 5xx, never sent), by route kind.",
    { route_kind = UPSTREAM_KINDS })
  self.retries:init { route_kind = "model" }
  self.reflection = reg:counter("sbx_reflection_refusals_total",
    "Upstream replies the credential reflection filter refused.")
  local always = {}
  for i, s in ipairs(M.CONTAINER_STATES) do always[i] = { state = s } end
  reg:gauge("sbx_containers", "Sandbox containers of this engine, by state (running, warm, removing).",
    { state = STATES }, function(emit) self:_collect_containers(emit) end, always)
  reg:gauge("sbx_channel_queue_depth", "Turns waiting in the channel queues behind a running turn.", nil,
    function(emit) self:_collect_queue(emit) end, { {} })
  self.cleanup_failures = reg:counter("sbx_cleanup_failures_total",
    "Container removals that failed (a turn's own container, the stale sweep).")
  process.register(reg)               -- sbx_build_info and the process_* families
  return self
end

function Metrics:add_mode(mode)
  assert(MODE_SET[mode], "unknown mode " .. tostring(mode))
  for _, reason in ipairs(M.reasons_of(mode)) do self.turns:init { mode = mode, reason = reason } end
  self.turn_seconds:init { mode = mode }
end

-- The record reader: fn(record) for recorder:subscribe.
function Metrics:reader()
  return function(r)
    if r.kind == "call" then self:_call(r)
    elseif r.kind == "turn" then self:_turn(r)
    elseif r.kind == "precheck" then
      self.turns:inc { mode = "precheck", reason = r.reason }
      local s = seconds(r.ms)
      if s then self.turn_seconds:observe({ mode = "precheck" }, s) end
    elseif r.kind == "cleanup" then
      if r.ok == false then self.cleanup_failures:inc() end
    end
  end
end

function Metrics:_turn(t)
  self.turns:inc { mode = t.mode, reason = t.reason }
  local s = seconds(t.ms)
  if s then self.turn_seconds:observe({ mode = t.mode }, s) end
  for _, p in ipairs(M.PHASES) do
    local v = seconds(t[p[2]])
    if v then self.phase_seconds:observe({ phase = p[1] }, v) end
  end
  if t.removal_failed then self.cleanup_failures:inc() end
end

function Metrics:_call(c)
  self.requests:inc { route_kind = c.route_kind, status = c.status }
  if c.reason and lines.REFUSALS[c.reason] then self.refusals:inc { reason = c.reason } end
  if c.reason == "reflection" then self.reflection:inc() end
  if c.upstream_status then
    self.upstream:inc { route_kind = c.route_kind, status = c.upstream_status }
  end
  local s = seconds(c.upstream_ms)
  if s then self.upstream_seconds:observe({ route_kind = c.route_kind }, s) end
  if c.tries and c.tries > 1 then self.retries:inc({ route_kind = c.route_kind }, c.tries - 1) end
  local u = c.usage
  if u then
    for _, d in ipairs(M.TOKEN_DIRECTIONS) do
      local n = u[d]
      if n and n > 0 then self.tokens:inc({ direction = d }, n) end
    end
  end
end

local Source = {}
Source.__index = Source
function Source:remove() self.list[self] = nil end

local function add_source(list, fn)
  assert(type(fn) == "function", "a metrics source must be a function")
  local h = setmetatable({ list = list, fn = fn }, Source)
  list[h] = true
  return h
end

-- fn() -> {running = n, warm = n, removing = n} (any subset), read at every
-- scrape; the values of every source are summed.
function Metrics:containers_source(fn) return add_source(self.container_sources, fn) end

-- fn() -> the number of turns waiting in a queue, read at every scrape.
function Metrics:queue_source(fn) return add_source(self.queue_sources, fn) end

function Metrics:_collect_containers(emit)
  for h in pairs(self.container_sources) do
    local ok, counts = pcall(h.fn)
    if ok and type(counts) == "table" then
      for _, state in ipairs(M.CONTAINER_STATES) do
        local n = counts[state]
        if type(n) == "number" and n > 0 then emit({ state = state }, n) end
      end
    end
  end
end

function Metrics:_collect_queue(emit)
  for h in pairs(self.queue_sources) do
    local ok, n = pcall(h.fn)
    if ok and type(n) == "number" and n > 0 then emit(nil, n) end
  end
end

function Metrics:render()
  return self.registry:render()
end

return M
