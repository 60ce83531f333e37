-- precheck/_run.lua: one precheck run (shared/spec/precheck.md 4), steps 1-10
-- in order: signal, grant with the run's tier, approvals, worker input, run
-- and workspace directories, the precheck broker, the backstop deadline, the
-- container, the answer, and the cleanup that always runs last.
--
--   run.run(o, script, context) -> result (yields; raises the spec's errors)
--
-- o: the resolved options (lua/sandbox/precheck/_options.lua). Nothing is
-- created before step 5; from then on `runRoot` is left empty however the
-- run ends, and the run settles only after its container has been removed.
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local grants = require "sandbox.precheck._grant"
local json = require "sandbox.json"
local options = require "sandbox.precheck._options"
local precheck_broker = require "sandbox.precheck._broker"
local signals = require "sandbox.signal"

local M = {}

M.E_TOO_LARGE = errors.PRECHECK_TOO_LARGE
M.E_UNREADABLE = errors.PRECHECK_UNREADABLE
M.E_SCRIPT_FAILED = errors.PRECHECK_SCRIPT_FAILED
M.E_TIMED_OUT = errors.PRECHECK_TIMED_OUT
M.E_SOCKET = errors.SOCKET_TOO_LONG
M.E_CONTEXT = errors.PRECHECK_CONTEXT
M.E_SCRIPT = errors.PRECHECK_SCRIPT
M.E_RUN_DIR = errors.PRECHECK_RUN_DIR

M.MAX_INPUT_BYTES = 65536
M.MAX_STDOUT_BYTES = 65536
M.MAX_ERROR_CHARS = 1000
M.NAME_PREFIX = "roundtable-precheck-"

local function fail(msg) error(msg, 0) end

-- Step 1 (and what the later steps read): the context the core hands over.
local function check_context(script, context)
  if type(script) ~= "string" or not json.utf8_valid(script) then fail(M.E_SCRIPT) end
  if type(context) ~= "table" then fail(M.E_CONTEXT) end
  local s = context.schedule
  if type(s) ~= "table" then fail(M.E_CONTEXT) end
  local id = container.as_integer(s.id)
  if id == nil or id < 0 or type(s.title) ~= "string" then fail(M.E_CONTEXT) end
  for _, k in ipairs { "firedAt", "timeZone", "today" } do
    if type(context[k]) ~= "string" then fail(M.E_CONTEXT) end
  end
  return id
end

-- Step 4: compact JSON, members in the spec's order, no URL and no token.
function M.input_json(script, context, id, servers)
  local list = json.array {}
  for i, s in ipairs(servers) do
    list[i] = json.object({ "name", "tools" }, { name = s.name, tools = json.array(options.copy_list(s.tools)) })
  end
  local out = json.encode(json.object(
    { "script", "firedAt", "timeZone", "today", "schedule", "servers" }, {
      script = script, firedAt = context.firedAt, timeZone = context.timeZone, today = context.today,
      schedule = json.object({ "id", "title" }, { id = id, title = context.schedule.title }),
      servers = list,
    }))
  if out == nil then fail(M.E_CONTEXT) end
  if #out > M.MAX_INPUT_BYTES then fail(M.E_TOO_LARGE) end
  return out
end

-- The first n characters of a UTF-8 string.
local function cut(s, n)
  local stop = utf8.offset(s, n + 1)
  if stop == nil then return s end
  return s:sub(1, stop - 1)
end

-- Step 9: {"ok":true,"result":...} -> result; {"ok":false,"error":...} raises
-- (and sets outcome.script_error, when given: the text is the script's own,
-- which may spell any catalogue message).
function M.read_answer(stdout, outcome)
  local v = type(stdout) == "string" and json.decode(stdout) or nil
  if v == nil or json.kind(v) ~= "object" or type(v.ok) ~= "boolean" then fail(M.E_UNREADABLE) end
  if not v.ok then
    if outcome then outcome.script_error = true end
    if type(v.error) ~= "string" then fail(M.E_SCRIPT_FAILED) end
    fail(cut(v.error, M.MAX_ERROR_CHARS))
  end
  if v.result == json.null then return nil end
  return v.result
end

local function container_name(id)
  return M.NAME_PREFIX .. id .. "-" .. assert(core.random_hex(4))
end

-- Steps 5-10 once nothing remains that can refuse without creating.
local function contained(o, servers, input, id, scope, run_sig, record)
  local root = o.runRoot
  local run_dir = core.fs_mkdtemp(root .. "/precheck-XXXXXX")
  local ws_dir = run_dir and core.fs_mkdtemp(root .. "/precheck-ws-XXXXXX")
  local broker, timer
  local ok, res = pcall(function()
    if not run_dir or not ws_dir then fail(M.E_RUN_DIR) end                 -- 5
    local path = run_dir .. "/broker.sock"
    if #path > options.MAX_SOCKET_PATH then fail(M.E_SOCKET) end
    local err                                                                 -- 6
    broker, err = precheck_broker.start(path, servers, {
      maxCalls = o.maxCalls, signal = run_sig, scope = scope, allowHttp = o.allowHttpMcp,
      fetchImpl = o.fetchImpl, recorder = o.recorder, run = record,
    })
    if not broker then fail(err) end
    timer = core.timer(o.timeoutMs or options.DEFAULT_TIMEOUT_MS, function()  -- 7
      run_sig:abort(M.E_TIMED_OUT)
    end)
    local spec = options.container_spec(o, container_name(id), run_dir, ws_dir)
    spec.entrypoint = options.copy_list(o.entrypoint)
    local stdout = o.driver.exec(spec, input, run_sig, { stdoutBytes = M.MAX_STDOUT_BYTES })  -- 8
    if run_sig.aborted then error(run_sig.reason, 0) end
    return M.read_answer(stdout, record)                                             -- 9
  end)
  -- 10: always. Cleanup errors are ignored and never replace the answer.
  if timer then timer:stop() end
  if broker then pcall(broker.stop, broker) end
  run_sig:abort("run ended")
  if ws_dir then pcall(core.fs_rmtree, ws_dir) end
  if run_dir then pcall(core.fs_rmtree, run_dir) end
  if not ok then error(res, 0) end
  return res
end

-- The run record's reason and fix for how contained() ended (the operator
-- log's `precheck finished` line; ops/record.lua run_begin). A script's own
-- error text is the core's to show, never the log's.
M.RUN_DIR_FIX = errors.reason_fix("run_dir")   -- the one catalogue (sandbox/errors.lua)

local function settle(o, rec, ok, res, run_sig, parent)
  rec.ok = ok
  local ctx = { image = o.image }
  if ok then
    rec.reason = "ok"
  elseif run_sig.aborted and run_sig.reason == M.E_TIMED_OUT then
    rec.reason, rec.fix = "deadline", errors.fix(M.E_TIMED_OUT)
  elseif run_sig.aborted and parent and parent.aborted then
    rec.reason = "stopped"
  elseif rec.script_error then
    rec.reason = "script_error"
  elseif res == M.E_UNREADABLE then
    rec.reason, rec.fix = "invalid_reply", errors.reason_fix("invalid_reply", ctx)
  elseif res == M.E_RUN_DIR or res == M.E_SOCKET then
    rec.reason, rec.fix = "run_dir", M.RUN_DIR_FIX
  else
    local e = errors.entry(res)
    rec.reason = e and e.reason or "worker_failed"
    rec.fix = (e and errors.fix(res, ctx)) or errors.reason_fix(rec.reason, ctx)
  end
  rec.script_error = nil
  o.recorder:run_end(rec)
end

function M.run(o, script, context)
  local parent = type(context) == "table" and context.signal or nil
  -- 1
  if parent and parent.aborted then error(parent.reason, 0) end
  local id = check_context(script, context)
  -- 2: the run's tier, never the schedule's creation tier
  local schedule = context.schedule
  local scope = grants.scope(schedule.channel, schedule.target, context.tier)
  local granted = grants.call(o.grant, grants.scope(schedule.channel, schedule.target, context.tier),
    o.allowHttpMcp)
  -- (token hooks get a copy of the same scope)
  -- 3
  local servers = grants.filter(granted, context.tools)
  -- 4
  local input = M.input_json(script, context, id, servers)
  if parent and parent.aborted then error(parent.reason, 0) end
  local run_sig = signals.child(parent)
  local rec = o.recorder:run_begin(type(schedule.channel) == "string" and schedule.channel or nil, id)
  local ok, res = pcall(contained, o, servers, input, id, scope, run_sig, rec)
  settle(o, rec, ok, res, run_sig, parent)
  run_sig:detach()
  if not ok then error(res, 0) end
  return res
end

return M
