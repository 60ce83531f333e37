-- unix_request.lua: a raw client for Unix stream sockets, for specs and
-- benches only (test transports stay out of the product library, as Lua's
-- ltests.c and libuv's test/ do). It sends bytes exactly as given (hostile
-- heads included), holds idle connections open and dribbles requests, and
-- tells whether the server closed without writing anything (data == "").
-- Built on the product's own core.unix_stream and core.timer.
--
--   local unix_request = require "unix_request"   (busted: spec/support is on lpath)
--   unix_request(path, bytes, opts, cb) -> handle | nil, "invalid socket path"
--     opts.timeout_ms  whole exchange (default 65000, the worker's deadline)
--     opts.max_bytes   reply bytes kept (default 1 MiB + 64 KiB); one more
--                      ends the exchange with "too large"
--     opts.keep_open   no half-close after bytes; handle:write() may add more
--     opts.half_close  shut the write side after bytes (default true)
--     cb{ ok = true, data = } at EOF, or { ok = false, error = "connect" |
--     "io" | "timeout" | "too large", data = what was read }, exactly once
--     and never after handle:close()
--   handle:write(bytes) -> true | nil, err   (keep_open only)
--   handle:shutdown()                         half-close now (keep_open)
--   handle:close()                            abort; cb never runs
--
-- A handle that is collected does not abort the exchange: the stream and
-- the timer hold their callbacks (and so the handle) until the end.
local core = require "sandbox.core"

local DEFAULT_TIMEOUT_MS = 65000
local DEFAULT_MAX_BYTES = core.limits.MAX_REPLY_BYTES + 65536
local MAX_PATH = 107                    -- sun_path: 108 bytes with the NUL

local Handle = {}
Handle.__index = Handle

local function finish(h, err)
  if h.done then return end
  h.done = true
  h.timer:stop()
  h.stream:close()
  local data = table.concat(h.chunks)
  if err == nil then h.cb({ ok = true, data = data })
  else h.cb({ ok = false, error = err, data = data }) end
end

local function on_event(h, ev, x)
  if h.done then return end
  if ev ~= "data" then return finish(h, x) end  -- "end": nil at EOF, "connect" or "io"
  local room = h.max - h.len
  if #x > room then
    h.chunks[#h.chunks + 1] = x:sub(1, room)
    h.len = h.max
    return finish(h, "too large")
  end
  h.chunks[#h.chunks + 1] = x
  h.len = h.len + #x
end

local function unix_request(path, bytes, opts, cb)
  assert(type(path) == "string" and type(bytes) == "string", "unix_request(path, bytes, opts, cb)")
  assert(type(cb) == "function", "unix_request: cb must be a function")
  opts = opts or {}
  if #path == 0 or #path > MAX_PATH or path:find("\0", 1, true) then return nil, "invalid socket path" end
  local h = setmetatable({
    cb = cb, done = false, chunks = {}, len = 0, shut = false,
    max = opts.max_bytes or DEFAULT_MAX_BYTES, keep_open = opts.keep_open == true,
  }, Handle)
  local stream, err = core.unix_stream(path, function(ev, x) on_event(h, ev, x) end)
  if not stream then return nil, err end
  h.stream = stream
  h.timer = core.timer(opts.timeout_ms or DEFAULT_TIMEOUT_MS, function() finish(h, "timeout") end)
  stream:write(bytes)                   -- queued until the connect completes
  if not h.keep_open and opts.half_close ~= false then
    h.shut = true
    stream:shutdown()
  end
  return h
end

function Handle:write(bytes)
  if self.done or not self.keep_open or self.shut then return nil, "not writable" end
  if not self.stream:write(bytes) then return nil, "EPIPE" end
  return true
end

function Handle:shutdown()
  if self.done or self.shut then return end
  self.shut = true
  self.stream:shutdown()
end

function Handle:close()
  if self.done then return end
  self.done = true
  self.timer:stop()
  self.stream:close()
end

return unix_request
