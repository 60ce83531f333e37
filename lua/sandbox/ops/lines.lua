-- ops/lines.lua: the operator log's lines about turns and broker calls
-- (spec/operations.md 2-3, providers.md 4), written from the records of
-- ops/record.lua by one reader, so what a line says is exactly what the
-- record holds:
--
--   recorder:subscribe(lines.reader(logger, { audit = true }))
--
-- Per call (audit, unless audit = false):
--   info  broker call channel=… turn=… route=/model status=200 ms=812 upstream_status=200 bytes_in=1834 bytes_out=922
--   warn  broker call … status=502 reason=upstream_status upstream_status=401 …   (an accepted call that failed)
--   warn  broker refused channel=… turn=… route=- status=404 reason=unknown_route
--         (every reason of operations.md 3, at whichever step it was decided)
-- Per call, always (the operator must see why the provider said no):
--   warn  model call refused upstream channel=… turn=… status=400 code=unsupported_parameter param=max_tokens
--         request_id=req_… fix="…"   (request_id: the provider's, for a support ticket)
--   warn  model reply refused channel=… turn=… reason=reflection route=/model fix="…"
--   error apiKey raised an error channel=… turn=… route=/model   (credential_error: the line its fix points to)
-- Per turn:
--   debug turn started channel=… turn=…
--   info  turn finished channel=… turn=… reason=ok ms=… model_calls=… tool_calls=… mcp_calls=…
--         refused_calls=… tool_failures=… exit=0 ms_start=… ms_first_call=… ms_reply=… ms_removed=…
--   warn  the same with the failure's reason, its fix and, for upstream_status, route, status and
--         the code/type/param tokens; for upstream_unreachable and upstream_timeout, route and
--         cause (why no answer came: "name resolution failed", "connection refused", ...)
-- Per precheck run (lua/sandbox/precheck), after its container was removed:
--   info  precheck finished channel=… turn=<run id> reason=ok schedule=13 ms=… mcp_calls=… refused_calls=…
--   warn  the same with reason=script_error|deadline|stopped|… and its fix
--   (its broker's requests have the same audit lines as a turn's)
-- A route is the configured path (never a guest's unknown target: those show as route=-); a
-- host shows as its name only.
local M = {}

local function base(r)
  return { channel = r.channel, turn = r.turn, route = r.route or "-" }
end

local function tokens(f, c)
  f.code, f.type, f.param = c.code, c.type, c.param
end

-- The refusal reasons of spec/operations.md 3 (and client_closed, a call
-- whose client left before its reply): a call that ends with one of them is
-- `broker refused`; any other call is `broker call` (warn when it failed).
M.REFUSALS = {
  unknown_route = true, method = true, query = true, header = true, credential_header = true,
  body_too_large = true, malformed_json = true, payload = true, budget = true, busy = true,
  connections = true, header_deadline = true, request_deadline = true, not_bound = true,
  after_turn = true, client_closed = true,
}

local function call_lines(logger, c, audit)
  if c.reason == "upstream_status" then
    local f = base(c)
    f.status = c.upstream_status
    f.route = c.route
    tokens(f, c)
    f.request_id = c.request_id
    f.fix = c.fix
    logger:warn((c.route_kind == "model" and "model" or "mcp") .. " call refused upstream", f)
  elseif c.reason == "reflection" then
    local f = base(c)
    f.reason, f.fix = "reflection", c.fix
    logger:warn((c.route_kind == "model" and "model" or "mcp") .. " reply refused", f)
  elseif c.reason == "credential_error" then
    logger:error("apiKey raised an error", base(c))
  elseif c.reason == "budget_exceeded" and c.budget_error then
    logger:error("budget hook raised an error", base(c))
  end
  if not audit then return end
  local f = base(c)
  f.status = c.status
  f.reason = c.reason
  if c.accepted then
    f.ms = c.ms
    f.upstream_status = c.upstream_status
    f.cause = c.cause
    if c.reason then f.request_id = c.request_id end
    if c.tries and c.tries > 1 then f.tries = c.tries end
    f.fallback = c.fallback
    f.bytes_in, f.bytes_out = c.bytes_in, c.bytes_out
    if c.usage then f.tokens_in, f.tokens_out = c.usage.input, c.usage.output end
  end
  f.header = c.header
  if c.reason and M.REFUSALS[c.reason] then logger:warn("broker refused", f)
  elseif c.reason then logger:warn("broker call", f)
  else logger:info("broker call", f) end
end

local function turn_line(logger, t)
  local f = {
    channel = t.channel, turn = t.turn, reason = t.reason, ms = t.ms, exit = t.exit,
    model_calls = t.model_calls, tool_calls = t.tool_calls, mcp_calls = t.mcp_calls,
    refused_calls = t.refused_calls, tool_failures = t.tool_failures,
    ms_start = t.ms_start, ms_first_call = t.ms_first_call, ms_reply = t.ms_reply,
    ms_removed = t.ms_removed,
    tokens_in = t.tokens_in, tokens_out = t.tokens_out,
    tokens_cached = t.tokens_cached ~= 0 and t.tokens_cached or nil,
    tokens_reasoning = t.tokens_reasoning ~= 0 and t.tokens_reasoning or nil,
  }
  if t.reason == "ok" then
    logger:info("turn finished", f)
    return
  end
  f.fix = t.fix
  local up = t.upstream
  if up then
    f.route, f.status = up.route, up.upstream_status
    tokens(f, up)
    f.cause = up.cause
    f.request_id = up.request_id
  end
  logger:warn("turn finished", f)
end

-- A precheck run (ops/record.lua run_end): info when ok, warn otherwise.
local function precheck_line(logger, r)
  local f = {
    channel = r.channel, turn = r.turn, reason = r.reason, schedule = r.schedule, ms = r.ms,
    mcp_calls = r.mcp_calls, refused_calls = r.refused_calls,
  }
  if r.reason == "ok" then
    logger:info("precheck finished", f)
    return
  end
  f.fix = r.fix
  logger:warn("precheck finished", f)
end

-- The reader: fn(record). opts.audit (default true) writes the audit lines.
function M.reader(logger, opts)
  local audit = not (opts and opts.audit == false)
  return function(r)
    if r.kind == "call" then call_lines(logger, r, audit)
    elseif r.kind == "turn" then turn_line(logger, r)
    elseif r.kind == "precheck" then precheck_line(logger, r)
    elseif r.kind == "turn_started" then logger:debug("turn started", { channel = r.channel, turn = r.turn }) end
  end
end

return M
