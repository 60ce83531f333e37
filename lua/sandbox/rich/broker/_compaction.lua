-- rich/broker/_compaction.lua: POST /compaction/compact and
-- /compaction/report (spec/rich-mode.md 15.3-15.5). Both need a bound turn
-- that is neither aborted nor failed (the startup scope never qualifies) and
-- use no call budget. compact checks, in the page's order: a compactor
-- exists; none is still running (the slot stays taken until the callback's
-- coroutine has really returned, even past an ignored abort); at most three
-- per turn; the declared and the read size against maxRequestBytes; the
-- timeout min(timeoutMs, floor((deadline - now)/2)) at least 1,000 ms; the
-- request shape; then the callback, raced against turn OR request OR
-- timeout. Every fallback is 200 {"ok":false,"fallback":reason} and one warn
-- line. report counts first (the 17th gets 429), reads at most 64 KiB,
-- validates and logs. Every request writes one audit line (spec/operations.md
-- 3, through rich/broker/_audit.lua): a refusal (method, not_bound,
-- after_turn, budget, body_too_large, malformed_json, payload) is "broker
-- refused"; an answered request, fallbacks included, "broker call" with its
-- sizes.
local async = require "sandbox.async"
local audit = require "sandbox.rich.broker._audit"
local core = require "sandbox.core"
local json = require "sandbox.json"
local signal = require "sandbox.signal"
local text = require "sandbox.rich._text"

local M = {}

M.MAX_PER_TURN = 3
M.MAX_REPORTS = 16
M.REPORT_MAX = 64 * 1024
M.MIN_TIMEOUT_MS = 1000
M.CEILING = 500000
M.REASONS = { manual = true, threshold = true, overflow = true }

M.TURN_ENDED = "Turn ended"
M.REPORTS = "Report budget exhausted"
M.BAD_REPORT = "Invalid report"
M.ACCEPTED = "Accepted"

M.NONE = "the host has no compactor"
M.RUNNING = "a compaction is already running"
M.THIRD = "the turn already asked for 3 compactions"
M.SHORT = "the turn has too little time left for the host compactor"
M.INVALID = "the request is invalid"
M.DECLINED = "the compactor declined"
M.BAD_RESULT = "the compactor's result is invalid"
M.ABORTED = "the compaction was aborted"

local kind = json.kind

-- The bodies' shapes (issue 21, 15.2-15.4): a member outside them is
-- refused while the text is scanned, before any value is built (the
-- request's fallback "the request is invalid", the report's 400). The
-- message lists are Pi's messages, handed to the compactor whole: kept as
-- they are, within the decode budget.
M.REQUEST_SHAPE = { members = {
  reason = true, tokensBefore = true, firstKeptEntryId = true, isSplitTurn = true,
  messagesToSummarize = true, turnPrefixMessages = true, keptMessages = true,
  previousSummary = true, customInstructions = true, readFiles = true, modifiedFiles = true,
} }
M.REPORT_SHAPE = { members = {
  type = true, reason = true, aborted = true, willRetry = true, engine = true, error = true,
  tokensBefore = true, tokensAfter = true, contextAfter = true, nextCompactionAt = true,
} }

local function is_int(v, lo) return math.type(v) == "integer" and v >= (lo or 0) end
local function chars_within(s, lo, hi) return type(s) == "string" and text.within(s, lo, hi) end

local function messages_ok(list)
  if kind(list) ~= "array" and not (type(list) == "table" and next(list) == nil) then return false end
  for _, m in ipairs(list) do
    if kind(m) ~= "object" or type(m.role) ~= "string" then return false end
  end
  return true
end

local function strings_ok(list)
  if kind(list) ~= "array" and not (type(list) == "table" and next(list) == nil) then return false end
  for _, s in ipairs(list) do if type(s) ~= "string" then return false end end
  return true
end

function M.request_ok(r)
  if kind(r) ~= "object" or not M.REASONS[r.reason] or not is_int(r.tokensBefore) then return false end
  if not chars_within(r.firstKeptEntryId, 1, 256) or type(r.isSplitTurn) ~= "boolean" then return false end
  for _, k in ipairs { "messagesToSummarize", "turnPrefixMessages", "keptMessages" } do
    if not messages_ok(r[k]) then return false end
  end
  if r.previousSummary ~= nil and type(r.previousSummary) ~= "string" then return false end
  if r.customInstructions ~= nil and type(r.customInstructions) ~= "string" then return false end
  return strings_ok(r.readFiles) and strings_ok(r.modifiedFiles)
end

local function result_ok(res, req)
  if type(res) ~= "table" then return false end
  if type(res.summary) ~= "string" or res.summary == "" then return false end
  if res.firstKeptEntryId ~= req.firstKeptEntryId then return false end
  if math.type(res.tokensBefore) ~= "integer" then return false end
  if res.estimatedTokensAfter ~= nil and math.type(res.estimatedTokensAfter) ~= "integer" then return false end
  if res.details ~= nil and type(res.details) ~= "table" then return false end
  return true
end

local function turn_scope(b)
  local s = b.bound
  if s == nil or s.gone or s.failed or s.signal.aborted then return nil end
  return s
end

local function fallback(b, conn, s, reason)
  b.log.warn("compaction falls back to Pi's summary", { channel = s.channel, turn = s.turnId, engine = b.compaction and b.compaction.engine or nil, fallback = reason })
  return conn:reply(200, json.encode(json.object({ "ok", "fallback" }, { ok = false, fallback = reason })), "application/json")
end

local function compact(b, conn, s, rec)
  local c = b.compaction
  if not c then return fallback(b, conn, s, M.NONE) end                                     -- 1
  if b.compacting then return fallback(b, conn, s, M.RUNNING) end                           -- 2
  s.compactions = (s.compactions or 0) + 1
  if s.compactions > M.MAX_PER_TURN then return fallback(b, conn, s, M.THIRD) end           -- 3
  local over = ("the request is over %d bytes"):format(c.maxRequestBytes)
  local declared = tonumber(conn.headers["content-length"] or "")
  if declared and declared > c.maxRequestBytes then return fallback(b, conn, s, over) end   -- 4
  local started = b.clock.now()
  local deadline = s.deadline or (started + b.turnTimeoutMs)
  local timeout = math.floor(math.min(c.timeoutMs, (deadline - started) // 2))
  if timeout < M.MIN_TIMEOUT_MS then return fallback(b, conn, s, M.SHORT) end               -- 5
  local sig, timed_out = signal.new(), false
  local hooks = {
    s.signal:on_abort(function(r) sig:abort(r) end),
    conn.signal:on_abort(function(r) sig:abort(r) end),
  }
  local timer = b.clock.timer(math.floor(timeout), function() timed_out = true sig:abort("timeout") end)
  local function done() timer:stop() for _, u in ipairs(hooks) do u() end end
  local bytes, why = conn:body(c.maxRequestBytes, sig)                                       -- 6
  if bytes then rec.bytes_in = #bytes end
  if not bytes then
    done()
    if why ~= "aborted" and why ~= "closed" then return fallback(b, conn, s, over) end
    return fallback(b, conn, s, timed_out and ("the compactor took over %d ms"):format(timeout) or M.ABORTED)
  end
  local req = json.decode_body(bytes, M.REQUEST_SHAPE)
  bytes = nil
  if not M.request_ok(req) then done() return fallback(b, conn, s, M.INVALID) end           -- 7
  b.compacting = true
  local task = async.spawn(c.compact, req, { channel = s.channel, turn = s.turnId, signal = sig })
  async.on_done(task, function() b.compacting = false end)
  local finished = async.wait_or_abort(task, sig)
  done()
  -- A result that arrives once the signal aborted is not used (10, 11).
  if timed_out then return fallback(b, conn, s, ("the compactor took over %d ms"):format(timeout)) end  -- 10
  if sig.aborted or not finished then return fallback(b, conn, s, M.ABORTED) end            -- 11
  if task.ok then
    local res = task.results[2]
    if res == nil then return fallback(b, conn, s, M.DECLINED) end                          -- 8
    if not result_ok(res, req) then return fallback(b, conn, s, M.BAD_RESULT) end           -- 9
    local details = {}
    for k, v in pairs(res.details or {}) do details[k] = v end
    details.engine = c.engine
    b.log.info("host compactor answered", { channel = s.channel, turn = s.turnId, engine = c.engine, tokensBefore = res.tokensBefore,
      tokensAfter = res.estimatedTokensAfter, latencyMs = b.clock.now() - started })
    local out = json.object({ "summary", "firstKeptEntryId", "tokensBefore", "estimatedTokensAfter", "details" }, {
      summary = res.summary, firstKeptEntryId = res.firstKeptEntryId, tokensBefore = res.tokensBefore,
      estimatedTokensAfter = res.estimatedTokensAfter, details = json.jsonable(details),
    })
    return conn:reply(200, json.encode(json.object({ "ok", "compaction" }, { ok = true, compaction = out })), "application/json")
  end
  return fallback(b, conn, s, "the compactor failed: "                                      -- 12
    .. core.scrub_diagnostic(text.error_text(task.results[2]), 2000))
end

function M.report_ok(r)
  if kind(r) ~= "object" then return false end
  if r.type == "bypass" then
    return chars_within(r.reason, 0, 1000) and is_int(r.tokensBefore)
  end
  if r.type ~= "end" or not M.REASONS[r.reason] then return false end
  if type(r.aborted) ~= "boolean" or type(r.willRetry) ~= "boolean" then return false end
  if r.engine ~= nil and r.engine ~= "extension" and r.engine ~= "pi" then return false end
  for _, k in ipairs { "tokensBefore", "tokensAfter", "contextAfter", "nextCompactionAt" } do
    if r[k] ~= nil and not is_int(r[k]) then return false end
  end
  return r.error == nil or chars_within(r.error, 0, 10000)
end

local function report(b, conn, s, rec)
  s.reports = (s.reports or 0) + 1
  if s.reports > M.MAX_REPORTS then rec.reason = "budget" return conn:reply(429, M.REPORTS) end
  local bytes, why = conn:body(M.REPORT_MAX)
  if bytes then rec.bytes_in = #bytes end
  local r = bytes and json.decode_body(bytes, M.REPORT_SHAPE)
  if not M.report_ok(r) then
    if not bytes then rec.reason = tostring(why):find("^EFBIG") and "body_too_large" or "client_closed"
    else rec.reason = kind(r) == "object" and "payload" or "malformed_json" end
    return conn:reply(400, M.BAD_REPORT)
  end
  if r.type == "bypass" then
    b.log.info("compaction skips the extension for Pi's summary", { channel = s.channel, turn = s.turnId, reason = r.reason,
      tokensBefore = r.tokensBefore, ceiling = M.CEILING })
  else
    local trigger = r.reason == "manual" and "self" or r.reason
    if r.engine == nil then
      b.log.warn("compaction failed", { channel = s.channel, turn = s.turnId, trigger = trigger, aborted = r.aborted, error = r.error })
    else
      b.log.info("conversation compacted", { channel = s.channel, turn = s.turnId, trigger = trigger, engine = r.engine,
        tokensBefore = r.tokensBefore, tokensAfter = r.tokensAfter, contextAfter = r.contextAfter,
        nextCompactionAt = r.nextCompactionAt })
    end
  end
  return conn:reply(200, M.ACCEPTED)
end

function M.route(b, conn, path)
  local route = audit.route("compaction", path)
  if conn.method ~= "POST" then
    conn:reply(404, "Not found")
    return audit.refused(b, b.bound, 404, "method", route)
  end
  local s = turn_scope(b)
  if not s then
    conn:reply(410, M.TURN_ENDED)
    return audit.refused(b, b.bound, 410, b.bound and "after_turn" or "not_bound", route)
  end
  local rec = audit.begin(b, s, route, {})
  local ok, err = pcall(path == "/compaction/compact" and compact or report, b, conn, s, rec)
  if not ok then
    b.log.error("sandbox broker handler failed", { channel = s.channel, turn = s.turnId, route = "compaction", error = tostring(err):sub(1, 300) })
    conn:fail()
  end
  if rec.reason then rec.accepted = false end                -- a refusal line carries no sizes
  audit.finish(b, rec, conn)
end

return M
