-- rich/broker/_audit.lua: a rich broker's call records (sandbox/ops/record.lua),
-- one per request the audit covers, settled into the runtime's recorder,
-- whose reader (sandbox/ops/lines.lua) writes the payload-free audit line of
-- spec/operations.md 3 through the one operator logger:
--   info  broker call channel=… turn=… route=/anthropic/v1/messages status=200 ms=… upstream_status=200 bytes_in=… bytes_out=…
--   warn  broker refused channel=… turn=… route=- status=404 reason=unknown_route
--   warn  broker call … reason=reflection …            (an accepted call that failed)
-- Covered: every request except the worker transport (/worker/*) and
-- discovery (GET /mcp-tools), the worker's own machinery, which carries no
-- credential and spends no budget (a long poll every 45 s would be a line
-- each); what C refuses before Lua sees a request (17th connection, head
-- deadline, malformed or repeated head) is covered too.
--
-- Reasons are operations.md 3's closed set: refusals unknown_route, method,
-- query, header, body_too_large, malformed_json, payload (a body the page's
-- rules refuse: a model refusal, an MCP method, a tool input or a private
-- result the worker cannot keep), budget, busy, connections, header_deadline,
-- request_deadline, not_bound (the startup scope, no turn bound),
-- after_turn, client_closed; an accepted call that failed
-- credential_missing, credential_error, tool_failed, upstream_unreachable,
-- upstream_timeout, upstream_invalid, reflection. An upstream status the
-- worker receives unchanged (4xx, 5xx: rich-mode.md 11.5) is no failure of
-- the call: its line is info with upstream_status, and the page's own
-- "sandbox upstream call failed" warning says the rest.
--
--   audit.route(kind, path)               -> {kind, path} for a configured route
--   audit.refused(b, s, status, reason, route?)
--   audit.begin(b, s, route, call)        -> rec (accepted; call.rec = rec)
--   audit.finish(b, rec, conn)
--   audit.c_refused(b, reason, status)    what C refused (core.stream_listen on_refused)
--   audit.aborted(call)                   the reason of a call its signal ended
local record = require "sandbox.ops.record"

local M = {}

local KINDS = { model = "model", tool = "tools", mcp = "mcp" }

-- The route a line names: the configured path (never a guest's unknown
-- target, which shows as route=-).
function M.route(kind, path)
  return { kind = KINDS[kind] or "other", path = path }
end

local function channel_of(b, s)
  return b.channel or (s and s.channel) or nil
end

-- Into the recorder, counted in the bound turn's record when the scope has
-- one (rich/_turn.lua: the turn's model, tool and refused calls, and the
-- last model call its reason is read from).
local function settle(b, rec, t)
  local r = b.log and b.log.recorder
  if r then pcall(r.call, r, t, rec) end
end

function M.refused(b, s, status, reason, route)
  local rec = record.call(channel_of(b, s), s and s.turnId, route and route.path, route and route.kind)
  rec.status, rec.reason, rec.ms = status, reason, 0
  settle(b, rec, s and s.record)
end

function M.c_refused(b, reason, status)
  local s = b.bound
  M.refused(b, s, status, reason, nil)
end

function M.begin(b, s, route, call)
  local rec = record.call(channel_of(b, s), s.turnId, route.path, route.kind)
  rec.accepted = true
  rec.turn_record = s.record
  call.rec = rec
  return rec
end

function M.aborted(call)
  local sig = call.signal
  if sig and sig.reason == "deadline" then return "request_deadline" end
  if call.scope and call.scope.signal.aborted then return "after_turn" end
  return "client_closed"
end

-- Sets the record's reason once (the first failure decided says why).
function M.why(call, reason)
  local rec = call.rec
  if rec and rec.reason == nil then rec.reason = reason end
end

function M.finish(b, rec, conn)
  rec.status, rec.bytes_out = conn.status, conn.bytes_out
  if rec.reason == nil and conn.status == 0 then
    -- nothing was written: the client left, or the turn ended first
    rec.reason = conn.signal.aborted and "client_closed" or "after_turn"
  end
  local t = rec.turn_record
  rec.turn_record = nil
  settle(b, rec, t)
end

return M
