-- rich/broker/_http.lua: the broker's face of the C stream listener
-- (core.stream_listen, spec/rich-mode.md 8). C owns the socket (0600, 16
-- connections, the 10 s head deadline, the 120 s silence timer, the repeated
-- header refusal, one request per connection with `connection: close`,
-- backpressure) and, with the sealed broker's listener, the descriptor
-- budget of shared/spec/hardening.md 2 (core/conn.c). The listener outlives
-- turns, so it holds one turn's descriptor charge from listen to stop
-- (runtime/_descriptors.lua: its 2 guaranteed connections; the rest come
-- from the shared pool); a host that cannot carry it refuses the listen
-- (errors.HOST_DESCRIPTORS). This file turns each request into a `conn` a
-- broker task uses with sequential, yielding calls:
--
--   conn.method, conn.target, conn.headers (lower-case names)
--   conn.signal           aborts when the request ends (response flushed,
--                         client gone, silence, destroyed, forced stop)
--   conn:body(max, sig)   -> bytes | nil, why  (yields; a larger declared
--                         length is refused unread; sig aborting gives up)
--   conn:reply(status, body, content_type[, extra headers map]) -> written
--   conn:start(status, {{name, value}, ...}) -> written
--   conn:write(chunk)     -> true | false (the request ended); yields while
--                         16 KiB or more are queued unsent (backpressure)
--   conn:finish()  conn:destroy()  conn:fail() (400 before the head, else destroy)
--   conn.status, conn.bytes_out   what was written (the audit line's status and
--                         bytes_out; status 0 while nothing was)
local async = require "sandbox.async"
local core = require "sandbox.core"
local descriptors = require "sandbox.runtime._descriptors"
local errors = require "sandbox.errors"
local signal = require "sandbox.signal"

local M = {}

M.PLAIN = "text/plain; charset=utf-8"

local Conn = {}
Conn.__index = Conn

local function new_conn(req)
  local c = setmetatable({
    req = req, method = req.method, target = req.target, headers = req.headers or {},
    signal = signal.new(), drain_waiters = {}, status = 0, bytes_out = 0,
  }, Conn)
  req:on_close(function(reason)
    c.signal:abort(reason or "closed")
    c:_drained()
  end)
  req:on_drain(function() c:_drained() end)
  return c
end

function Conn:_drained()
  local ws = self.drain_waiters
  self.drain_waiters = {}
  for _, w in ipairs(ws) do w() end
end

function Conn:body(max, sig)
  if self.signal.aborted then return nil, "closed" end
  local unhooks = {}
  local bytes, why = async.await(function(resume)
    local ok, err = self.req:read_body(max, function(b, e) resume(b, e) end)
    if not ok then resume(nil, err) return end
    unhooks[1] = self.signal:on_abort(function() resume(nil, "closed") end)
    if sig then unhooks[2] = sig:on_abort(function() resume(nil, "aborted") end) end
  end)
  for _, u in ipairs(unhooks) do u() end
  return bytes, why
end

function Conn:reply(status, body, ctype, extra)
  body = body or ""
  local h = { ["content-type"] = ctype or M.PLAIN }
  for k, v in pairs(extra or {}) do h[k] = v end
  local ok = self.req:respond(status, h, body)
  if ok then self.status, self.bytes_out = status, #body end
  return ok
end

function Conn:start(status, list)
  local h = {}
  for _, kv in ipairs(list or {}) do h[kv[1]] = kv[2] end
  local ok = self.req:start(status, h)
  if ok then self.status = status end
  return ok
end

function Conn:write(chunk)
  local ok, pressured = self.req:write(chunk)
  if not ok then return false end
  self.bytes_out = self.bytes_out + #chunk
  if pressured and not self.signal.aborted then
    async.await(function(resume) self.drain_waiters[#self.drain_waiters + 1] = resume end)
  end
  return not self.signal.aborted or self.req:is_open()
end

function Conn:finish() return self.req:finish() end
function Conn:destroy() self.req:destroy() end
function Conn:fail() self.req:fail() end

-- The listener and its descriptor charge: stop([force]) and stats() of the
-- core's listener; the charge goes back at the first stop (or when the
-- object is collected unstopped).
local Server = {}
Server.__index = Server

local function uncharge(s)
  if s.charged then
    s.charged = false
    descriptors.release()
  end
end

function Server:stop(force)
  uncharge(self)
  return self.listener:stop(force)
end

function Server:stats() return self.listener:stats() end

Server.__gc = uncharge

-- o = {path, on_request(conn), on_refused(reason, status)?, idle_ms?,
-- header_timeout_ms?}: the listener, or nil and the core's message.
-- on_request runs as its own task; on_refused (what C refused itself) on
-- the loop.
function M.listen(o)
  descriptors.raise()
  if not descriptors.take() then return nil, errors.HOST_DESCRIPTORS end
  local listener, err = core.stream_listen {
    path = o.path, idle_ms = o.idle_ms, header_timeout_ms = o.header_timeout_ms, on_refused = o.on_refused,
    on_request = function(req)
      local conn = new_conn(req)
      local task = async.spawn(o.on_request, conn)
      async.on_done(task, function(t)
        if not t.ok then
          core.log("error", "rich broker: request task failed: " .. tostring(t.results[2]):sub(1, 300))
          pcall(conn.fail, conn)
        end
      end)
    end,
  }
  if not listener then
    descriptors.release()
    return nil, err
  end
  return setmetatable({ listener = listener, charged = true }, Server)
end

return M
