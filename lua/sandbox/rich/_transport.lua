-- rich/_transport.lua: how the broker reaches its trusted upstreams (the
-- Anthropic endpoint, the MCP servers). One shape for both the built-in
-- transport and the operator's `fetchImpl` seam (spec/rich-mode.md 3):
--
--   fetch{method, url, headers = {name = value}, body, signal}
--     -> {status, headers = {name = value} (lower-case names),
--         body = iterator (next chunk, nil at the end; yields; raises on a
--         transport failure), cancel = function}
--   (raises when no response exists: connection error, abort)
--
-- transport.curl{cainfo?, connectTo?} is the built-in one: core.http_stream
-- (libcurl on the loop, no redirects, no proxy or cookies, TLS verified; C
-- owns the policy). At most 16 KiB wait unread in Lua before the transfer is
-- paused; it resumes when the broker pulls, so a slow worker slows the
-- upstream instead of filling memory. An http:// URL is used only because
-- the configuration admitted it (allowHttpMcp); a trusted seam may add a CA
-- file or connect-to entries for loopback fixtures.
-- transport.new(fetchImpl) wraps a fetchImpl (a host function that may
-- yield; body a string or an iterator) into the same contract, raced
-- against the request's signal, or returns the built-in one.
local async = require "sandbox.async"
local core = require "sandbox.core"
local errors = require "sandbox.errors"

local M = {}

M.HIGH_WATER = 16384
M.TIMEOUT_MS = 600000

local function header_lines(h)
  local names, lines = {}, {}
  for k in pairs(h or {}) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do lines[#lines + 1] = k .. ": " .. h[k] end
  return lines
end

local function lower_map(h)
  local out = {}
  for k, v in pairs(h or {}) do
    if type(k) == "string" then
      if type(v) == "table" then v = table.concat(v, ", ") end
      if type(v) == "string" then out[k:lower()] = v end
    end
  end
  return out
end

-- A failed transfer as an error value (errorText renders it): curl's text,
-- with the errno name as its cause when known.
local function transfer_error(res)
  if res.error == "too large" then return errors.RICH_TOO_LARGE end
  local e = { name = "Error", message = res.message or res.error or "transfer failed" }
  if res.code then e.cause = { name = "Error", message = res.code } end
  return e
end

function M.curl(seams)
  seams = seams or {}
  return function(req)
    local sig = req.signal
    local queue, queued, done, failure = {}, 0, false, nil
    local waiter, paused, call = nil, false, nil
    local function wake()
      local w = waiter
      waiter = nil
      if w then w() end
    end
    local unhook
    local head = async.await(function(resume)
      local answered = false
      local function answer(v) if not answered then answered = true resume(v) end end
      local err
      call, err = core.http_stream {
        url = req.url, method = req.method or "POST", headers = header_lines(req.headers), body = req.body,
        timeout_ms = M.TIMEOUT_MS, allow_http = req.url:sub(1, 7) == "http://",
        cainfo = seams.cainfo, connect_to = seams.connectTo,
        on_head = function(status, headers) answer({ status = status, headers = lower_map(headers) }) end,
        on_chunk = function(chunk)
          queue[#queue + 1] = chunk
          queued = queued + #chunk
          if queued >= M.HIGH_WATER and not paused then paused = true call:pause() end
          wake()
        end,
        on_done = function(res)
          done = true
          if not res.ok then failure = transfer_error(res) end
          answer({ error = failure or "no response" })
          wake()
        end,
      }
      if not call then answer({ error = err or "the transfer could not start" }) return end
      if sig then
        unhook = sig:on_abort(function()
          call:cancel()
          done, failure = true, failure or "aborted"
          answer({ error = "aborted" })
          wake()
        end)
      end
    end)
    if head.error then
      if unhook then unhook() end
      error(head.error, 0)
    end
    local function body()
      while #queue == 0 and not done do
        async.await(function(resume) waiter = resume end)
      end
      if #queue > 0 then
        local chunk = table.remove(queue, 1)
        queued = queued - #chunk
        if paused and queued < M.HIGH_WATER and not done then paused = false call:resume() end
        return chunk
      end
      if unhook then unhook() unhook = nil end
      if failure then error(failure, 0) end
      return nil
    end
    return { status = head.status, headers = head.headers, body = body,
      cancel = function() if unhook then unhook() unhook = nil end call:cancel() end }
  end
end

-- A string body or an iterator, as the broker reads it.
local function iterator(body)
  if body == nil then body = "" end
  if type(body) == "string" then
    local sent = false
    return function()
      if sent or body == "" then return nil end
      sent = true
      return body
    end
  end
  if type(body) ~= "function" then error("fetchImpl answered a body that is neither a string nor an iterator", 0) end
  return function()
    local chunk = body()
    if chunk ~= nil and type(chunk) ~= "string" then error("fetchImpl's body iterator gave a non-string", 0) end
    return chunk
  end
end

function M.new(fetch_impl)
  if fetch_impl == nil then return M.curl() end
  return function(req)
    local task = async.spawn(fetch_impl, {
      method = req.method, url = req.url, headers = req.headers, body = req.body, signal = req.signal,
    })
    if req.signal and not async.wait_or_abort(task, req.signal) then error("aborted", 0) end
    if not req.signal then async.wait(task) end
    if not task.ok then error(task.results[2], 0) end
    local res = task.results[2]
    if type(res) ~= "table" then error("fetchImpl answered no response", 0) end
    return { status = res.status, headers = lower_map(res.headers), body = iterator(res.body), cancel = res.cancel }
  end
end

return M
