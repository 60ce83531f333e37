-- adapters/postgres/_rules.lua: what the adapter accepts from a guest and
-- from the bound turn: the bounds (LIMITS, one table the other parts read),
-- the text checks, the row owner of a reader, the refusal texts.
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local M = {}

M.LIMITS = {
  key = 128,          -- bytes
  value = 4000,       -- bytes
  ident = 256,        -- channel, owner, author (bytes)
  rowsPerOwner = 200, -- private rows of one owner in one channel
  rowsShared = 500,   -- shared rows of one channel
  promptRows = 100,   -- rows of each kind in a prompt block
  promptChars = 100000,
}

local VIS = { private = true, shared = true }

M.VIS = VIS

-- A guest string: valid UTF-8, no NUL, no control characters in keys.
function M.text_ok(s, lo, hi, is_key)
  if type(s) ~= "string" or #s < lo or #s > hi or not json.utf8_valid(s) or s:find("\0", 1, true) then
    return false
  end
  if is_key and s:find("[%c]") then return false end
  return true
end
local text_ok = M.text_ok

-- The row owner of a reader: "p:" .. principalId, else "s:" .. speaker id.
-- The two namespaces never meet, so a speaker whose platform id happens to
-- equal someone's principalId is not that principal. nil when neither is
-- a valid identifier.
function M.owner(id, principalId)
  if principalId ~= nil then
    return text_ok(principalId, 1, M.LIMITS.ident) and "p:" .. principalId or nil
  end
  return text_ok(id, 1, M.LIMITS.ident) and "s:" .. id or nil
end

-- The bound identity: the turn's channel and its reader. Raises (the turn's
-- operator sees tool_failed) when the host bound none.
function M.identity(ctx)
  local channel, sp = ctx and ctx.channel, ctx and ctx.speaker
  local owner = type(sp) == "table" and M.owner(sp.id, sp.principalId)
  if not text_ok(channel, 1, M.LIMITS.ident) or not owner then error(errors.PG_IDENTITY, 0) end
  return channel, owner
end

function M.refused(tool, why) return tool .. " refused: " .. why end

M.KEY_RULE = "key must be a string of 1 to 128 bytes of UTF-8 text without control characters"
M.VALUE_RULE = "value must be a string of at most 4000 bytes of UTF-8 text without NUL"
M.VIS_RULE = 'visibility must be "private" (the default) or "shared"'

return M
