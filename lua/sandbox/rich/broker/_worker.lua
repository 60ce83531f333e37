-- rich/broker/_worker.lua: the worker transport (spec/rich-mode.md 10): the
-- routes the worker opens (ready, config, the next long poll, the result
-- packet) and the host's execute(). One parked poll, one admitted turn and
-- one packet being received per broker (= per channel). The host never
-- connects to a socket the guest made and never reads a path it chose.
--
-- State on the broker b:
--   b.poll      the parked long poll {wake()} or nil
--   b.pending   {request, encoded, signal, delivered, settle(ok, v)} or nil
--   b.receiving a result packet is being read
--   b.caps, b.requirement, b.ready (10.2, 14.1)
local async = require "sandbox.async"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local media = require "sandbox.rich._media"
local privacy = require "sandbox.rich.broker._privacy"
local signal = require "sandbox.signal"
local text = require "sandbox.rich._text"

local M = {}

M.READY_MAX = 16384
M.RESULT_MAX = 72 * 1024 * 1024
M.POLL_MS = 45000
M.MAX_TEXT = 100000
M.MAX_ERROR = 10000

M.NOT_FOUND = "Not found"
M.READY = "Ready"
M.BAD_READY = "Invalid ready handshake"
M.WAITING = "Already waiting"
M.RETRY = "Retry"
M.NO_TURN = "No matching turn"
M.RECEIVING = "Already receiving"
M.BAD_RESULT = "Invalid result"
M.ACCEPTED = "Accepted"

local kind = json.kind

-- The pending turn fails (a problem found by ready, a tool or step 6).
function M.fail_pending(b, message)
  local p = b.pending
  if p and p.settle then p.settle(false, message) end
end

-- 14.1: while the requirement is set and a capability is missing, the scope
-- (the bound turn's by default) is failed, the pending turn fails with the
-- problem text, and the text is returned for the caller's answer.
function M.enforce(b, s)
  if not b.requirement then return nil end
  local miss = privacy.missing(b.caps)
  if not miss then return nil end
  local problem = privacy.problem(b.workerImage, miss)
  s = s or b.bound
  if s then s.failed = problem end
  M.fail_pending(b, problem)
  return problem
end

-- The bodies' shapes (issue 21, 10.1): a member outside them is refused
-- while the text is scanned, before any value is built, with the route's
-- own 400; reply files past 10 likewise (16.2).
M.READY_SHAPE = { members = { privateHistory = true, capabilities = { members = { privateTo = true, readerRecords = true } } } }
M.RESULT_SHAPE = { members = { turnId = true, result = { members = {
  ok = true, text = true, error = true,
  files = { max = 10, items = { members = { name = true, data = true } } },
} } } }

local function is_blank(s) return s:find("^[ \t\r\n]*$") ~= nil end

-- 10.2
local function ready(b, conn)
  local bytes = conn:body(M.READY_MAX)
  if not bytes then return conn:reply(400, M.BAD_READY) end
  local v
  if is_blank(bytes) then
    v = json.object({}, {})
  else
    v = json.decode_body(bytes, M.READY_SHAPE)
    if kind(v) ~= "object" then return conn:reply(400, M.BAD_READY) end
  end
  if v.privateHistory ~= nil and type(v.privateHistory) ~= "boolean" then return conn:reply(400, M.BAD_READY) end
  local caps = v.capabilities
  if caps ~= nil then
    if kind(caps) ~= "object" then return conn:reply(400, M.BAD_READY) end
    for _, k in ipairs { "privateTo", "readerRecords" } do
      if caps[k] ~= nil and type(caps[k]) ~= "boolean" then return conn:reply(400, M.BAD_READY) end
    end
  end
  b.caps = { privateTo = caps ~= nil and caps.privateTo == true, readerRecords = caps ~= nil and caps.readerRecords == true }
  if v.privateHistory == true then b.requirement = true end
  if b.pending then M.enforce(b) end
  b.ready = true
  b:_rearm()
  return conn:reply(200, M.READY)
end

-- 10.3
local function config(b, conn)
  local v = json.object({}, {})
  if b.compaction_engine then
    v = json.object({ "compaction" }, { compaction = json.object({ "engine" }, { engine = b.compaction_engine }) })
  end
  return conn:reply(200, json.encode(v), "application/json")
end

-- Hands the pending turn to conn; false when it could not be written (the
-- turn stays undelivered for the next poll).
local function deliver(b, conn, p)
  p.delivered = true
  if conn:reply(200, p.encoded, "application/json") then
    b:_trace { event = "delivered", at = b.clock.now() }
    return true
  end
  if b.pending == p then p.delivered = false end
  return false
end

-- 10.4
local function next_poll(b, conn)
  if b.poll then return conn:reply(429, M.WAITING) end
  local p = b.pending
  if p and not p.delivered then return deliver(b, conn, p) end
  local poll = {}
  b.poll = poll
  local woke = async.await(function(resume)
    poll.wake = function() resume("turn") end
    local t = b.clock.timer(M.POLL_MS, function() resume("timeout") end)
    poll.stop = function() t:stop() end
    poll.unhook = conn.signal:on_abort(function() resume("gone") end)
  end)
  poll.stop()
  poll.unhook()
  if b.poll == poll then b.poll = nil end
  p = b.pending
  if woke == "turn" and p and not p.delivered and not conn.signal.aborted then return deliver(b, conn, p) end
  return conn:reply(408, M.RETRY)
end

local function result_ok(r)
  if r.ok == true then
    if not text.within(r.text, 0, M.MAX_TEXT) then return false end
    if not media.check_files(r.files) then return false end
    return true
  end
  return text.within(r.error, 0, M.MAX_ERROR)
end

-- 10.5
local function result(b, conn)
  local p = b.pending
  if not p or not p.delivered or p.signal.aborted then return conn:reply(409, M.NO_TURN) end   -- 1
  if b.receiving then return conn:reply(429, M.RECEIVING) end                                 -- 2
  b.receiving = true                                                                           -- 3
  local ok, status, answer = pcall(function()
    local sig = signal.new()
    local u1 = p.signal:on_abort(function() sig:abort("turn cancelled") end)
    local bytes = conn:body(M.RESULT_MAX, sig)
    u1()
    if not bytes then return 400, M.BAD_RESULT end
    local v = json.decode_body(bytes, M.RESULT_SHAPE)
    bytes = nil
    if v == nil then return 400, M.BAD_RESULT end
    if kind(v) ~= "object" or b.pending ~= p or v.turnId ~= p.request.turnId or not p.delivered          -- 4
        or kind(v.result) ~= "object" or type(v.result.ok) ~= "boolean" then
      return 409, M.NO_TURN
    end
    if not result_ok(v.result) then return 400, M.BAD_RESULT end                                 -- 5
    local r = v.result
    local out
    if r.ok then out = { ok = true, text = r.text, files = r.files } else out = { ok = false, error = r.error } end
    b:_trace { event = "result", at = b.clock.now() }
    p.settle(true, out)                                                                          -- 6
    return 200, M.ACCEPTED
  end)
  b.receiving = false
  if not ok then status, answer = 400, M.BAD_RESULT end
  return conn:reply(status, answer)
end

function M.route(b, conn, path)
  local m = conn.method
  if path == "/worker/ready" and m == "POST" then return ready(b, conn) end
  if path == "/worker/config" and m == "GET" then return config(b, conn) end
  if path == "/worker/next" and m == "GET" then return next_poll(b, conn) end
  if path == "/worker/result" and m == "POST" then return result(b, conn) end
  return conn:reply(404, M.NOT_FOUND)
end

-- The 10.1 turn request as JSON, its members in the page's order.
function M.encode_request(r)
  local a = r.author or {}
  local images = json.array()
  for i, img in ipairs(r.images or {}) do
    images[i] = json.object({ "data", "mimeType" }, { data = img.data, mimeType = img.mimeType })
  end
  return json.encode(json.object(
    { "turnId", "author", "text", "memory", "memoryVisibility", "images", "thinking" }, {
      turnId = r.turnId,
      author = json.object({ "id", "name", "principalId" }, { id = a.id, name = a.name, principalId = a.principalId }),
      text = r.text, memory = r.memory or "", memoryVisibility = r.memoryVisibility or "private",
      images = images, thinking = r.thinking,
    }))
end

-- 10.6: queues the turn for the worker and yields until its result packet
-- (the {ok, text, files} or {ok=false, error} table) or a failure (raised).
function M.execute(b, request, sig)
  if b.pending then error(errors.RICH_WORKER_BUSY, 0) end                          -- 1
  if b.requirement or privacy.private_prompt(request) then                          -- 2
    local miss = privacy.missing(b.caps)
    if miss then error(privacy.problem(b.workerImage, miss), 0) end
    b.requirement = true
  end
  sig = sig or signal.new()
  if sig.aborted then error(errors.RICH_TURN_CANCELLED, 0) end                      -- 3
  local encoded = M.encode_request(request)
  if not encoded then error(errors.RICH_TURN_INPUT, 0) end
  local p = { request = request, encoded = encoded, signal = sig, delivered = false }
  b.pending = p                                                                     -- 4
  local unhook
  local ok, value = async.await(function(resume)
    p.settle = function(good, v) p.settle = nil resume(good, v) end
    unhook = sig:on_abort(function() if p.settle then p.settle(false, errors.RICH_TURN_CANCELLED) end end)
    if b.poll and b.poll.wake then b.poll.wake() end
  end)
  if unhook then unhook() end
  if b.pending == p then b.pending = nil end
  if not ok then error(value, 0) end
  return value
end

return M
