-- fake_driver.lua: Lua fake drivers for the runtime specs (spec/runtime.md
-- 4.1: offline specs use Lua fake drivers). A fake implements
-- `driver:run(spec, turn, signal) -> {ok, text}` with a behaviour function and
-- records every call (spec, turn, its JSON encoding, the signal). A behaviour
-- may act as the worker: connect to the turn's real broker socket
-- (spec.runDir .. "/broker.sock") and post requests over it.
--
--   local fake = require "fake_driver"
--   local d = fake.new(function(spec, turn, sig, call) return {ok=true, text="done"} end)
--   d.calls[1].spec, d.calls[1].turn, d.calls[1].encoded
--   fake.post(spec, "/tools/whoami", '{"speaker":"owner"}') -> {status=, body=}
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local unix_request = require "unix_request"

local M = {}

M.DUMMY = "Bearer sandbox-dummy-key"

local Driver = {}
Driver.__index = Driver

function M.new(behaviour, extra)
  local d = setmetatable({ behaviour = behaviour, calls = {} }, Driver)
  for k, v in pairs(extra or {}) do d[k] = v end
  return d
end

function Driver:run(spec, turn, sig)
  local call = { spec = spec, turn = turn, encoded = json.encode(turn), signal = sig }
  self.calls[#self.calls + 1] = call
  return self.behaviour(spec, turn, sig, call, self)
end

-- Behaviours -----------------------------------------------------------------

function M.reply(ok, text)
  return function() return { ok = ok, text = text } end
end

-- Waits until the turn signal aborts, then returns {ok=false, text=text}
-- (the fake "observes the abort" and still answers).
function M.until_abort(text)
  return function(_, _, sig)
    M.wait_abort(sig)
    return { ok = false, text = text or "stopped" }
  end
end

-- Waits until the turn signal aborts, then raises its reason (as the CLI
-- driver does, spec/runtime.md 4.6 step 7).
function M.raise_on_abort()
  return function(_, _, sig)
    M.wait_abort(sig)
    error(sig.reason, 0)
  end
end

function M.wait_abort(sig)
  if sig.aborted then return end
  async.await(function(resume) sig:on_abort(function() resume() end) end)
end

-- Worker side ----------------------------------------------------------------

function M.socket(spec)
  return spec.runDir .. "/broker.sock"
end

function M.raw(route, body)
  return "POST " .. route .. " HTTP/1.1\r\nHost: broker\r\nContent-Type: application/json\r\n"
    .. "Authorization: " .. M.DUMMY .. "\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body
end

local function parse(data)
  local code = data:match("^HTTP/1%.1 (%d%d%d)")
  local body = data:match("\r\n\r\n(.*)$")
  return { status = tonumber(code), body = body, raw = data }
end

-- POSTs body to route over the turn's broker socket and waits for the reply
-- (inside a task). Returns {status=, body=} or {error=...}.
function M.post(spec, route, body)
  local res = async.await(function(resume)
    unix_request(M.socket(spec), M.raw(route, body), { timeout_ms = 20000 }, resume)
  end)
  if not res.ok then return { error = res.error } end
  return parse(res.data)
end

-- Sends a request and does not wait for the reply (a worker exiting while a
-- call is pending). Returns the request handle.
function M.post_and_leave(spec, route, body)
  return unix_request(M.socket(spec), M.raw(route, body), { timeout_ms = 20000 }, function() end)
end

return M
