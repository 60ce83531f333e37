-- rich/broker/_model.lua: POST /anthropic/v1/messages and
-- /anthropic/v1/messages/count_tokens, optionally ?beta=true (spec/rich-mode.md
-- 11): the rebuild and its refusals (11.1-11.2, providers/anthropic_messages.lua), the
-- credential of the admitting scope read fresh on every call (11.3), the
-- target URL, the rebuilt headers (11.4), then _forward.lua streams the
-- answer (11.5). A refusal is a 400 with the API's error shape and one
-- failure log line; nothing is sent upstream.
local anthropic = require "sandbox.providers.anthropic_messages"
local audit = require "sandbox.rich.broker._audit"
local credential = require "sandbox.broker._credential"
local errors = require "sandbox.errors"
local forward = require "sandbox.rich.broker._forward"
local json = require "sandbox.json"
local log = require "sandbox.rich._log"
local scope = require "sandbox.rich.broker._scope"

local M = {}

M.PATHS = { ["/anthropic/v1/messages"] = "messages", ["/anthropic/v1/messages/count_tokens"] = "count_tokens" }

-- The scope's token, or nil and the audit reason: a getter that raises
-- (credential_error), answers nil, "" or something unusable as a header
-- value (credential_missing), or the call ending first (nil).
function M.token(getter, s, sig)
  local status, value = credential.call_hook(getter, scope.credential_scope(s), sig)
  if status ~= "ok" then return nil, value == "raised" and "credential_error" or nil end
  if not credential.valid(value) then return nil, "credential_missing" end
  return value
end

function M.handle(b, conn, call)
  local s, path = call.scope, call.path
  local started = call.started
  local function failure(f)
    f.channel, f.turn, f.upstream, f.latencyMs = s.channel, s.turnId, "model", b.clock.now() - started
    log.upstream_failure(b.log, f)
  end
  local forced, refusal = anthropic.rebuild(call.body, {
    model = b.model, maxOutputTokens = b.maxOutputTokens, level = s.thinking,
    count_tokens = M.PATHS[path] == "count_tokens",
  })
  if not forced then
    audit.why(call, "payload")
    failure({ status = 400, error = refusal })
    return conn:reply(400, anthropic.refusal_body(refusal), "application/json")
  end
  local token, why = M.token(b.oauthToken, s, call.signal)
  if not token then
    audit.why(call, why or audit.aborted(call))
    failure({ error = errors.RICH_CREDENTIAL })
    return conn:reply(502, forward.FAILED, nil, forward.NO_RETRY)
  end
  local encoded = json.encode(forced)
  if not encoded then
    audit.why(call, "payload")
    failure({ error = "the rebuilt request is not encodable" })
    return conn:reply(502, forward.FAILED, nil, forward.NO_RETRY)
  end
  local url = b.upstream .. path:sub(#"/anthropic" + 1) .. (call.beta and "?beta=true" or "")
  return forward.run(b, conn, {
    scope = s, label = "model", url = url, headers = anthropic.request_headers(conn.headers, token), body = encoded,
    token = token, signal = call.signal, started = started, call = call,
  })
end

return M
