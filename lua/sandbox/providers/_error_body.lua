-- providers/_error_body.lua: what the operator may learn from an upstream's
-- error body (spec/providers.md 4), shared by every wire format: OpenAI
-- Chat Completions and its compatible providers put code/type/param in
-- `error` (or at the top level, or `error` itself is a string, kept as the
-- code; Gemini answers a one-element array of such an object), Anthropic
-- Messages puts `type` in `error` ({"type":"error","error":{"type":...}}).
-- Each token is kept only when it matches ^[A-Za-z0-9_.:-]{1,64}$ and holds
-- no form of the credential. Free text (`message`) can echo the request or
-- the key and is never kept. The body itself is the caller's to drop.
--
--   error_body.tokens(body, filter) -> {code=, type=, param=}   (each optional)
local json = require "sandbox.json"

local M = {}

M.MAX_TOKEN = 64

-- A kept token: a short run of [A-Za-z0-9_.:-] (an integer counts as its
-- decimal text: Gemini's error.code is the HTTP status).
local function token(v, filter)
  if math.type(v) == "integer" then v = tostring(v) end
  if type(v) ~= "string" or #v < 1 or #v > M.MAX_TOKEN or v:find("[^%w_%.:%-]") then return nil end
  if filter and filter:hit(v) then return nil end
  return v
end

function M.tokens(body, filter)
  local out = {}
  if type(body) ~= "string" or body == "" then return out end
  local v = json.decode(body)
  if json.kind(v) == "array" and json.kind(v[1]) == "object" then v = v[1] end
  if json.kind(v) ~= "object" then return out end
  local src = v
  if json.kind(v.error) == "object" then
    src = v.error
  elseif type(v.error) == "string" then
    out.code = token(v.error, filter)
  end
  out.code = out.code or token(src.code, filter)
  out.type = token(src.type, filter)
  out.param = token(src.param, filter)
  return out
end

return M
