-- broker/_retry.lua: the host's one retry policy for upstream calls (issue
-- 23 item 5). A call whose upstream answered 429 or 5xx, or could not be
-- reached before any byte was sent (name resolution, connection refused,
-- an unreachable network: the request never left), is tried again, at most
-- `upstreamRetries` more times (default 2, 0-5), after a wait: the
-- upstream's Retry-After when it gave one (delta-seconds or an HTTP-date,
-- core/upstream.c), else an exponential backoff with jitter (BASE_MS * 2^n,
-- times 0.5-1.5, at most MAX_BACKOFF_MS). A wait that would pass the call's
-- deadline is not taken: the last answer stands. The guest's call budget
-- is charged once per call, whatever its tries; each try is counted
-- (the call record's `tries`, sbx_upstream_retries_total).
--
--   retry.retryable(reason, info) -> bool   (post_json's reason and info)
--   retry.delay_ms(try, info[, rand]) -> ms  (try: the try that just failed, 1-based)
--   retry.check(v) -> n (raises errors.UPSTREAM_RETRIES)
local errors = require "sandbox.errors"

local M = {}

M.DEFAULT = 2
M.MAX = 5
M.BASE_MS = 500
M.MAX_BACKOFF_MS = 8000

-- Causes that mean the request never reached the upstream.
M.NOT_SENT = {
  ["name resolution failed"] = true, ["connection refused"] = true, ["network unreachable"] = true,
  ["could not connect"] = true, ["connect timed out"] = true,
}

function M.check(v)
  if v == nil then return M.DEFAULT end
  if math.type(v) ~= "integer" or v < 0 or v > M.MAX then error(errors.UPSTREAM_RETRIES, 0) end
  return v
end

function M.retryable(reason, info)
  local status = info and info.status
  if reason == "upstream_status" and (status == 429 or (status and status >= 500 and status <= 599)) then
    return true
  end
  return reason == "upstream_unreachable" and info ~= nil and M.NOT_SENT[info.cause] == true
end

function M.delay_ms(try, info, rand)
  local after = info and info.retry_after_ms
  if math.type(after) == "integer" and after >= 0 then return after end
  local base = math.min(M.MAX_BACKOFF_MS, M.BASE_MS * (1 << math.min(try - 1, 16)))
  return math.floor(base * (0.5 + (rand or math.random)()))
end

return M
