-- broker/_upstream.lua: one upstream POST for the broker, as a yielding call bounded
-- by the call signal and the time left of the call deadline (spec/broker.md
-- 7.2, 9.7, 9.8). The reply comes back as a decoded JSON value after the
-- strict parse and, when a credential was used, the reflection filter.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"

local M = {}

M.MAX_BODY = core.limits.MAX_UPSTREAM_BYTES   -- core/bounds.h

-- opts: url, headers (array of lines), body (string), deadline (core.now()
-- milliseconds), allow_http, content_type (also report the answer's
-- Content-Type), transport (trusted seam: {cainfo=, connectTo=}).
-- Returns core.http_post's result table for a 2xx ({ok=true, status, body
-- [, content_type]}), or nil and a short internal reason ("aborted",
-- "deadline", or core.http_post's error: "status", "too large", ...; never
-- shown to the guest, never holding payload) and the status when one came.
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
  if signal.aborted then return nil, "aborted" end
  if not res.ok then return nil, res.error, res.status end
  return res
end

-- M.post, then the strict parse and, when opts.credential is set, the
-- reflection filter. Returns the decoded value, or nil and a reason.
function M.post_json(opts, signal)
  local res, why = M.post(opts, signal)
  if not res then return nil, why end
  local filter = opts.credential and core.reflect_filter(opts.credential) or nil
  local value, err = json.decode(res.body, filter)
  if value == nil then return nil, err end
  return value
end

return M
