-- rich/broker/_forward.lua: one credential-bearing upstream call and its
-- answer streamed back to the worker (spec/rich-mode.md 11.4-11.6, and 13.1
-- for MCP, which shares every response rule). The request is already rebuilt;
-- this file owns:
--   - the transport call (fetchImpl or the built-in libcurl stream), bounded
--     by the call signal (scope OR request, and the turn deadline);
--   - 3xx refused (502 Broker call failed), a status outside 200-599 refused
--     (502 Upstream refused), 2xx passed on; on the model route (issue 26,
--     overriding 11.5's passthrough of error bodies) an error status is
--     retried by the host's one policy (broker/_retry.lua: 429, 5xx,
--     Retry-After, upstreamRetries, within the call's deadline; each try in
--     the record's `tries`) before any byte is written, and the final one
--     reaches the worker as rich/broker/_failure.lua's fixed, content-free
--     error with x-should-retry: false; an error event in a 200 event stream
--     is replaced by a content-free one and ends the stream; the model
--     route's 502s carry x-should-retry: false too. MCP routes pass error
--     statuses on unchanged (13.1: lapsed sessions);
--   - the response headers kept (content-type, request-id, x-should-retry,
--     retry-after, anthropic-ratelimit-*, and mcp-session-id on MCP routes;
--     each at most 256 bytes and free of every form of the token);
--   - the bounded reflection stream (a token split across chunks is caught,
--     50 MiB at most), the SSE error watch on a successful event stream, the
--     first 64 KiB of an error body for the log;
--   - backpressure: the next chunk is pulled only once the worker's side has
--     drained (conn:write yields while 16 KiB or more are queued);
--   - the upstream failure log (11.6) for every failure, and the audit
--     record's reason and upstream status (rich/broker/_audit.lua).
-- A failure before the head is written is 502 Broker call failed; after it,
-- the worker's connection is destroyed (a truncated response).
local anthropic = require "sandbox.providers.anthropic_messages"
local async = require "sandbox.async"
local audit = require "sandbox.rich.broker._audit"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local failure_mod = require "sandbox.rich.broker._failure"
local log = require "sandbox.rich._log"
local retry = require "sandbox.broker._retry"

local M = {}

M.FAILED = "Broker call failed"
M.REFUSED = "Upstream refused"
M.MAX_RESPONSE = 50 * 1024 * 1024
M.LOG_BODY = 65536
M.MAX_HEADER_VALUE = 256
-- The model route's own failures (no answer, a refused answer) are final
-- too: the host already retried (issue 26), the worker must not.
M.NO_RETRY = anthropic.NO_RETRY


local function kept_header(name, value, mcp, filter)
  if type(value) ~= "string" or #value > M.MAX_HEADER_VALUE or value:find("[%c]") then return false end
  if not (anthropic.response_header_kept(name) or (mcp and name == "mcp-session-id")) then return false end
  return not filter:hit(value)
end

-- The bounded reflection stream of 11.5 (core.reflect_stream, in C): push
-- -> bytes to emit | nil, error; finish() -> the held tail. A call without a
-- credential (an MCP server with no token getter) has nothing to reflect:
-- only the 50 MiB bound applies.
local STREAM_ERRORS = { reflected = errors.RICH_REFLECTED, ["too large"] = errors.RICH_TOO_LARGE }
-- The audit reason of a stream that broke.
local BROKEN_REASONS = {
  [errors.RICH_REFLECTED] = "reflection", [errors.RICH_TOO_LARGE] = "upstream_invalid",
  ["the worker went away"] = "client_closed",
}

local function reflection(token)
  local r = {}
  if token == nil or token == "" then
    local total = 0
    function r.push(chunk)
      total = total + #chunk
      if total > M.MAX_RESPONSE then return nil, errors.RICH_TOO_LARGE end
      return chunk
    end
    function r.finish() return "" end
    return r
  end
  local s = core.reflect_stream(token, M.MAX_RESPONSE)
  function r.push(chunk)
    local out, err = s:push(chunk)
    if out == nil then return nil, STREAM_ERRORS[err] or tostring(err) end
    return out
  end
  function r.finish() return s:finish() or "" end
  return r
end

-- The one final answer of a model call whose upstream answered an error
-- status (rich/broker/_failure.lua), and its operator line: status,
-- provider error type, request id, fix (providers.md 4), tries.
function M.final(b, conn, o, call, res, body, tries, filter, failure)
  local status = res.status
  if call.rec then call.rec.upstream_status = status end
  local tokens = anthropic.error_tokens(body, filter)   -- the provider seam
  local rid = failure_mod.request_id(res.headers, filter)
  if call.rec then call.rec.request_id = rid end
  failure({ status = status, type = tokens.type, request_id = rid, tries = tries,
    fix = failure_mod.UPSTREAM_FIX[status], body = body })
  local wstatus, wtype = failure_mod.answer(status, tokens)
  local headers = {}
  for name, value in pairs(res.headers or {}) do
    local n = type(name) == "string" and name:lower() or ""
    if anthropic.final_header_kept(n) and kept_header(n, value, false, filter) then
      headers[#headers + 1] = { n, value }
    end
  end
  headers[#headers + 1] = { "content-type", "application/json" }
  for n, v in pairs(anthropic.NO_RETRY) do headers[#headers + 1] = { n, v } end
  table.sort(headers, function(x, y) return x[1] < y[1] end)
  local text = failure_mod.body(wtype)
  if not conn:start(wstatus, headers) then
    audit.why(call, "client_closed")
    return
  end
  if not conn:write(text) then
    audit.why(call, "client_closed")
    return conn:destroy()
  end
  conn:finish()
end

-- o = {scope, label ("model" | "mcp:<server>"), url, headers (map), body,
-- token, signal, started, mcp (boolean), call (the admitted call: its
-- audit record)}
function M.run(b, conn, o)
  local call = o.call or { scope = o.scope, signal = o.signal }
  local function failure(f)
    f.channel, f.turn, f.upstream, f.latencyMs = o.scope.channel, o.scope.turnId, o.label, b.clock.now() - o.started
    log.upstream_failure(b.log, f, o.token)
  end
  local function why(reason) audit.why(call, reason) end
  local filter = o.token and o.token ~= "" and core.reflect_filter(o.token) or { hit = function() return false end }
  local retries, try = b.upstreamRetries or retry.DEFAULT, 0
  local ok, res
  while true do
    try = try + 1
    if call.rec then call.rec.tries = try end
    ok, res = pcall(b.fetch, { method = "POST", url = o.url, headers = o.headers, body = o.body, signal = o.signal })
    local status = ok and type(res) == "table" and res.status
    if o.mcp or math.type(status) ~= "integer" or status < 400 or status > 599 or o.signal.aborted then break end
    -- the model route's error status: never streamed to the worker
    local body = failure_mod.read(res, o.signal, M.LOG_BODY)
    if res.cancel then pcall(res.cancel) end
    local info = { status = status, retry_after_ms = failure_mod.retry_after_ms(res.headers) }
    local wait = try <= retries and retry.retryable("upstream_status", info) and retry.delay_ms(try, info) or nil
    if not wait or b.clock.now() + wait >= (call.deadline or math.huge) or not async.sleep_or_abort(wait, o.signal, b.clock.timer) then
      return M.final(b, conn, o, call, res, body, try, filter, failure)
    end
  end
  if not ok or type(res) ~= "table" then
    why(o.signal.aborted and audit.aborted(call) or "upstream_unreachable")
    failure({ error = ok and "the transport answered no response" or res })
    return conn:reply(502, M.FAILED, nil, not o.mcp and M.NO_RETRY or nil)
  end
  local status = res.status
  if call.rec and math.type(status) == "integer" then call.rec.upstream_status = status end
  local function cancel() if res.cancel then pcall(res.cancel) end end
  if o.signal.aborted then
    why(audit.aborted(call))
    cancel()
    failure({ status = status, error = "aborted" })
    return conn:reply(502, M.FAILED, nil, not o.mcp and M.NO_RETRY or nil)
  end
  if math.type(status) == "integer" and status >= 300 and status <= 399 then
    why("upstream_invalid")
    cancel()
    failure({ status = status, error = "redirect refused" })
    return conn:reply(502, M.FAILED, nil, not o.mcp and M.NO_RETRY or nil)
  end
  if math.type(status) ~= "integer" or status < 200 or status > 599 then
    why("upstream_invalid")
    cancel()
    failure({ status = math.type(status) == "integer" and status or nil, error = "status outside 200-599" })
    return conn:reply(502, M.REFUSED, nil, not o.mcp and M.NO_RETRY or nil)
  end
  local headers, ctype = {}, nil
  for name, value in pairs(res.headers or {}) do
    local n = type(name) == "string" and name:lower() or ""
    if n == "content-encoding" and type(value) == "string" and value:lower() ~= "identity" then
      why("upstream_invalid")
      cancel()
      failure({ status = status, error = "content-encoding " .. value:sub(1, 40) .. " refused" })
      return conn:reply(502, M.FAILED, nil, not o.mcp and M.NO_RETRY or nil)
    end
    if kept_header(n, value, o.mcp, filter) then
      headers[#headers + 1] = { n, value }
      if n == "content-type" then ctype = value end
    end
  end
  table.sort(headers, function(x, y) return x[1] < y[1] end)
  if not conn:start(status, headers) then
    why("client_closed")
    cancel()
    return
  end
  if status == 204 or status == 205 then
    cancel()
    conn:finish()
    return
  end
  local refl = reflection(o.token)
  local err_copy = status >= 400 and {} or nil
  local err_len = 0
  local sse = status < 400 and ctype and ctype:lower():find("^text/event%-stream")
  -- the model route cuts its event stream into whole events, so that a
  -- provider's error event is replaced, never written (_failure.lua)
  local guard = (sse and not o.mcp) and failure_mod.events() or nil
  local watch = (sse and not guard) and core.sse_watch() or nil
  local function stream_error(err)
    cancel()
    failure({ status = status, type = err.type, request_id = failure_mod.request_id(res.headers, filter),
      body = err.data and ("stream error event: " .. err.data) or nil, error = err.error })
    if conn:write(failure_mod.event(err.type)) then conn:finish() else conn:destroy() end
  end
  local function emit(out)
    if guard then
      local whole, err = guard:push(out)
      if #whole > 0 and not conn:write(whole) then return false end
      if err then stream_error(err) return nil end
      return true
    end
    return #out == 0 or conn:write(out)
  end
  local logged_event = false
  local body = res.body
  local broken
  while true do
    if o.signal.aborted then broken = "aborted" break end
    local got, chunk = pcall(body)
    if not got then broken = chunk break end
    if chunk == nil then break end
    if err_copy and err_len < M.LOG_BODY then
      local piece = chunk:sub(1, M.LOG_BODY - err_len)
      err_copy[#err_copy + 1] = piece
      err_len = err_len + #piece
    end
    if watch and not logged_event then
      local data = watch:push(chunk)
      if data then
        logged_event = true
        failure({ status = status, body = "stream error event: " .. data })
      end
    end
    local out, why = refl.push(chunk)
    if not out then broken = why break end
    local emitted = emit(out)
    if emitted == nil then return end
    if not emitted then broken = "the worker went away" break end
  end
  if broken and guard and broken == errors.RICH_REFLECTED then
    why("reflection")
    return stream_error({ error = broken })
  end
  if broken then
    why(BROKEN_REASONS[broken] or (broken == "aborted" and audit.aborted(call)) or "upstream_unreachable")
    cancel()
    failure({ status = status, error = broken, body = err_copy and table.concat(err_copy) or nil })
    conn:destroy()
    return
  end
  local rest = refl.finish()
  if guard then
    local whole, err = guard:push(rest)
    if err then
      if #whole == 0 or conn:write(whole) then stream_error(err) else conn:destroy() end
      return
    end
    local tail, terr = guard:rest()
    if terr then
      if #whole == 0 or conn:write(whole) then stream_error(terr) else conn:destroy() end
      return
    end
    rest = whole .. tail
  end
  if #rest > 0 and not conn:write(rest) then
    why("client_closed")
    failure({ status = status, error = "the worker went away" })
    conn:destroy()
    return
  end
  conn:finish()
  if err_copy then failure({ status = status, body = table.concat(err_copy) }) end
end

return M
