-- broker/_upstream.lua: one upstream POST for the broker, as a yielding call bounded
-- by the call signal and the time left of the call deadline (spec/broker.md
-- 7.2, 9.7, 9.8). The reply comes back as a decoded JSON value after the
-- strict parse and, when a credential was used, the reflection filter.
-- A failure comes back as the turn reason of spec/operations.md 1 it is, so
-- the call record (ops/record.lua) says why without holding a payload:
-- a non-2xx is "upstream_status" with the status and the tokens of
-- broker/_upstream_error.lua (its body, read up to 4,096 bytes, is dropped
-- here); connect, TLS and DNS failures "upstream_unreachable"; the
-- deadline "upstream_timeout"; a 2xx that is not bounded identity JSON
-- "upstream_invalid"; a reflected credential "reflection"; the call
-- signal "aborted".
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local upstream_error = require "sandbox.broker._upstream_error"

local M = {}

M.MAX_BODY = core.limits.MAX_UPSTREAM_BYTES   -- core/bounds.h
M.MAX_ERROR_BODY = core.limits.MAX_ERROR_BODY_BYTES
M.CALL_DEADLINE_REASON = "call deadline"

local BY_ERROR = {
  status = "upstream_status", network = "upstream_unreachable", timeout = "upstream_timeout",
  encoding = "upstream_invalid", ["too large"] = "upstream_invalid", aborted = "aborted",
  deadline = "upstream_timeout",
}

-- opts: url, headers (array of lines), body (string), deadline (core.now()
-- milliseconds), allow_http, content_type (also report the answer's
-- Content-Type), error_body (read up to 4,096 bytes of a non-2xx body, for
-- the operator log only), transport (trusted seam: {cainfo=, connectTo=}).
-- Returns core.http_post's result table for a 2xx ({ok=true, status, body
-- [, content_type]}), or nil and a short internal reason ("aborted",
-- "deadline", "call deadline" (the call signal's own deadline), or
-- core.http_post's error: "status", "too large", ...; never shown to the
-- guest, never holding payload), the status when one came, and the result
-- table (its error_body when asked for).
function M.post(opts, signal)
  if signal.aborted then return nil, "aborted" end
  local left = opts.deadline - core.now()
  if left <= 0 then return nil, "deadline" end
  local transport = opts.transport or {}
  local req
  local res = async.await(function(resume)
    req = core.http_post {
      url = opts.url,
      headers = opts.headers,
      body = opts.body,
      timeout_ms = left,
      max_body = M.MAX_BODY,
      error_body_max = opts.error_body and M.MAX_ERROR_BODY or nil,
      allow_http = opts.allow_http,
      content_type = opts.content_type,
      cainfo = transport.cainfo,
      connect_to = transport.connectTo,
      on_done = resume,
    }
    signal:on_abort(function()
      req:cancel()
      resume({ ok = false, error = "aborted" })
    end)
  end)
  if signal.aborted then
    return nil, signal.reason == M.CALL_DEADLINE_REASON and "call deadline" or "aborted"
  end
  if not res.ok then return nil, res.error, res.status, res end
  return res
end

-- The turn reason of M.post's failure `why` (operations.md 1), or nil for
-- the call signal's own abort: what a caller records of a failed post.
function M.reason_of(why)
  if why == "call deadline" then return "upstream_timeout" end
  local r = BY_ERROR[why] or "upstream_unreachable"
  if r == "aborted" then return nil end
  return r
end

-- M.post, then the strict parse and, when opts.credential is set, the
-- reflection filter. Returns the decoded value and info, or nil, the turn
-- reason and info; info = {status = the upstream's status when one
-- arrived, ms = the request's time when one was sent, bytes = reply bytes,
-- code=, type=, param= (upstream_status only), request_id = the provider's
-- request id header (x-request-id, request-id, apim-request-id, ...; core
-- upstream.h keeps the list; never one that holds the credential),
-- cause = why no answer came
-- (upstream_unreachable / upstream_timeout: "name resolution failed",
-- "connection refused", "TLS certificate verification failed", ...)}. Nothing in it is shown to a guest or holds payload.
function M.post_json(opts, signal)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.error_body = true
  local sent = core.now()
  local res, why, status, failed = M.post(o, signal)
  local info = { status = status or (res and res.status) }
  -- the time of the request itself, when one was sent and not abandoned
  -- (the metrics' upstream histogram, ops/metrics.lua)
  if res or (why ~= "aborted" and why ~= "deadline") then info.ms = core.now() - sent end
  local filter = opts.credential and core.reflect_filter(opts.credential) or nil
  -- the provider's request id, for the operator's support ticket only
  local rid = (res or failed or {}).request_id
  if type(rid) == "string" and not (filter and filter:hit(rid)) then info.request_id = rid end
  if not res then
    if why == "status" then
      local t = upstream_error.tokens(failed and failed.error_body, filter)
      info.code, info.type, info.param = t.code, t.type, t.param
    elseif failed and type(failed.cause) == "string" then
      info.cause = failed.cause
    end
    if failed and math.type(failed.retry_after_ms) == "integer" then info.retry_after_ms = failed.retry_after_ms end
    return nil, M.reason_of(why) or "aborted", info
  end
  info.bytes = #res.body
  local value, err = json.decode(res.body, filter)
  if value == nil then
    return nil, err == "reflection" and "reflection" or "upstream_invalid", info
  end
  return value, nil, info
end

return M
