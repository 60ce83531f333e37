-- rich/broker/_failure.lua: what the worker and the operator get when the
-- model upstream fails (issue 26; spec/rich-mode.md 11.5 as amended there,
-- providers.md 4). The provider's own error text never reaches the worker:
--   - an error status (>= 400) is answered with a fixed, content-free body
--     of the same error type, {"type":"error","error":{"type":T,"message":
--     "Upstream error"}}, and `x-should-retry: false` (the Anthropic SDKs'
--     own signal to give up: the host already retried, broker/_retry.lua);
--   - an `error` event inside a 200 event stream ends the stream with a
--     content-free error event of that shape (the provider's event is never
--     written: the stream is cut into whole events before it is written);
-- T is the upstream's error.type when it is one of Anthropic's documented
-- types, else api_error; the types and statuses the workers inside the
-- container retry by themselves whatever the header says (Claude Code and
-- Pi match "overloaded" / "rate limit" in the message, and retry 401, 408,
-- 409, 429 and 5xx by status) become api_error and status 400, so one
-- final answer ends the worker's call at once.
--
--   failure.UPSTREAM_FIX[status] -> the operator's fix
--   failure.body(type) -> the fixed JSON body
--   failure.event(type) -> the fixed SSE error event
--   failure.answer(status, tokens) -> worker status, worker type
--   failure.retry_after_ms(headers) -> ms | nil   (delta-seconds only)
--   failure.request_id(headers, filter) -> the provider's request id | nil
--   failure.read(res, signal, max) -> the first `max` bytes of the body
--   failure.events() -> guard: guard:push(bytes) -> bytes to write, error | nil; guard:rest()
--     (an event that may be an error event is held until it ends; others flow)
local json = require "sandbox.json"

local M = {}

-- The operator's fix for a final upstream status of the model route (the
-- failure line here, the turn line in rich/_turn.lua).
M.UPSTREAM_FIX = {
  [401] = "the provider refused the credential oauthToken returned: refresh the host's login",
  [403] = "the provider refused the credential oauthToken returned: refresh the host's login",
  [404] = "check upstream and the profile's model",
  [429] = "the provider is rate limiting or out of quota",
  other = "see the preceding `sandbox upstream call failed` line for the provider's answer",
}

M.MESSAGE = "Upstream error"
M.MAX_PENDING = 1024 * 1024   -- a held unfinished event longer than this is written as it is

-- Anthropic's documented error types (docs.anthropic.com/en/api/errors).
M.TYPES = {
  invalid_request_error = true, authentication_error = true, billing_error = true, permission_error = true,
  not_found_error = true, request_too_large = true, rate_limit_error = true, api_error = true,
  overloaded_error = true, timeout_error = true,
}
-- Types a worker retries by name, whatever the status and headers say.
M.RETRIED_TYPES = { rate_limit_error = true, overloaded_error = true, timeout_error = true }
-- Statuses a worker retries (the SDK's 408/409/429/5xx, Claude Code's 401).
local function retried_status(s) return s == 401 or s == 408 or s == 409 or s == 429 or s >= 500 end

function M.type_of(t)
  if type(t) == "string" and M.TYPES[t] and not M.RETRIED_TYPES[t] then return t end
  return "api_error"
end

function M.body(t)
  return '{"type":"error","error":{"type":"' .. M.type_of(t) .. '","message":"' .. M.MESSAGE .. '"}}'
end

function M.event(t)
  return "event: error\ndata: " .. M.body(t) .. "\n\n"
end

function M.answer(status, tokens)
  local t = tokens and tokens.type
  if retried_status(status) then return 400, M.type_of(t) end
  return status, M.type_of(t)
end

local function header(headers, want)
  for name, value in pairs(headers or {}) do
    if type(name) == "string" and name:lower() == want and type(value) == "string" then return value end
  end
end

function M.retry_after_ms(headers)
  local v = header(headers, "retry-after")
  local n = v and v:match("^%s*(%d%d?%d?%d?%d?)%s*$")
  return n and math.tointeger(tonumber(n) * 1000) or nil
end

function M.request_id(headers, filter)
  local v = header(headers, "request-id")
  if not v or #v > 128 or v:find("[^%w_%-]") then return nil end
  if filter and filter:hit(v) then return nil end
  return v
end

function M.read(res, signal, max)
  local out, len = {}, 0
  local body = res.body
  while body and len < max and not signal.aborted do
    local ok, chunk = pcall(body)
    if not ok or chunk == nil then break end
    local piece = chunk:sub(1, max - len)
    out[#out + 1] = piece
    len = len + #piece
  end
  return table.concat(out)
end

-- The error type an event's data names, when the event is an error.
local function error_of(ev)
  local name = ev:match("^event:[ ]?([^\r\n]*)") or ev:match("\nevent:[ ]?([^\r\n]*)")
  local data = {}
  for line in (ev .. "\n"):gmatch("([^\n]*)\n") do
    local d = line:gsub("\r$", ""):match("^data:[ ]?(.*)$")
    if d then data[#data + 1] = d end
  end
  local v = #data > 0 and json.decode(table.concat(data, "\n")) or nil
  local is_obj = json.kind(v) == "object"
  if name == "error" or (is_obj and v.type == "error") then
    local t = is_obj and json.kind(v.error) == "object" and v.error.type or nil
    return { type = type(t) == "string" and t or nil, data = table.concat(data, "\n") }
  end
end

local Guard = {}
Guard.__index = Guard

function M.events() return setmetatable({ pending = "", plain = false }, Guard) end

local ERROR_LINES = { "event: error", "event:error" }

-- Whether an unfinished event (at its start) may still turn out to be an
-- error event: its first line is, or may become, `event: error`, or it is a
-- data-first event. Only such events are held back until they end; every
-- other event's bytes flow as they arrive.
local function may_be_error(p)
  local first = p:match("^([^\n]*)") or p
  first = first:gsub("\r$", "")
  for _, e in ipairs(ERROR_LINES) do
    if e:sub(1, #first) == first or first:sub(1, #e) == e then return true end
  end
  return ("data:"):sub(1, #first) == first or first:sub(1, 5) == "data:"
end

-- The bytes of p that may be written while the event is plain: all but a
-- trailing run of line ends (a boundary may be split across chunks).
local function plain_cut(p)
  local keep = #(p:match("[\r\n]*$"))
  return p:sub(1, #p - keep), p:sub(#p - keep + 1)
end

-- bytes (already through the reflection stream) -> the bytes to write, and
-- the first error event's {type, data} (nothing from it on is written).
function Guard:push(bytes)
  local p = self.pending .. bytes
  local out, at = {}, 1
  while at <= #p do
    local s, e = p:find("\r?\n\r?\n", at)
    if self.plain then
      if not s then break end
      out[#out + 1] = p:sub(at, e)
      at, self.plain = e + 1, false
    elseif s then
      local err = error_of(p:sub(at, s - 1))
      if err then
        self.pending = ""
        return table.concat(out), err
      end
      out[#out + 1] = p:sub(at, e)
      at = e + 1
    elseif may_be_error(p:sub(at)) and #p - at < M.MAX_PENDING then
      break
    else
      self.plain = true
    end
  end
  local rest = p:sub(at)
  if self.plain then
    local now
    now, rest = plain_cut(rest)
    out[#out + 1] = now
  end
  self.pending = rest
  return table.concat(out)
end

function Guard:rest()
  local r = self.pending
  self.pending = ""
  local err = not self.plain and r:find("%S") and error_of(r) or nil
  if err then return "", err end
  return r
end

return M
