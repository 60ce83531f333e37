-- channels/_key.lua: the channel key grammar of spec/runtime.md 7.1 and the
-- workspace segment of 7.5. A key is `^[a-z][a-z0-9_-]*:.+$` over valid UTF-8,
-- at most 256 characters, with no C0 control, DEL, U+2028 or U+2029 anywhere.
-- The key is never interpreted as a path: the workspace is named by its hash.
local core = require "sandbox.core"
local errors = require "sandbox.errors"

local M = {}

M.MAX_CHARS = 256
M.E_INVALID = errors.CHANNEL

function M.valid(key)
  if type(key) ~= "string" or not core.utf8_valid(key) then return false end
  local n = utf8.len(key)
  if not n or n > M.MAX_CHARS then return false end
  if not key:find("^[a-z][a-z0-9_%-]*:.") then return false end
  if key:find("[%z\1-\31\127]") then return false end
  if key:find("\u{2028}", 1, true) or key:find("\u{2029}", 1, true) then return false end
  return true
end

-- Lowercase hex SHA-256 of the key's bytes (64 characters).
function M.segment(key)
  return core.sha256_hex(key)
end

return M
