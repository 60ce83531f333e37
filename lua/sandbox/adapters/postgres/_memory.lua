-- adapters/postgres/_memory.lua: rich mode's memory option
-- (memory.promptBlock, memory.visibility) over the notes table.
local db_mod = require "sandbox.adapters.postgres._db"
local errors = require "sandbox.errors"
local R = require "sandbox.adapters.postgres._rules"

local M = {}

local text_ok, VIS, VIS_RULE = R.text_ok, R.VIS, R.VIS_RULE
local db_of, opt_fail = db_mod.db_of, db_mod.opt_fail


local SHARED_ROWS = [[SELECT key, value FROM sbx_notes WHERE channel = $1::text AND owner = ''
  ORDER BY updated_at DESC, key LIMIT $2::integer]]
local PRIVATE_ROWS = [[SELECT key, value FROM sbx_notes WHERE channel = $1::text AND owner = $2::text
  ORDER BY updated_at DESC, key LIMIT $3::integer]]

-- Appends "- key: value" lines while the block stays within the limit.
local function add_lines(parts, size, title, rows)
  if #rows == 0 then return size end
  local head = title .. "\n"
  if size + #head > R.LIMITS.promptChars then return size end
  parts[#parts + 1] = head
  size = size + #head
  for _, r in ipairs(rows) do
    local line = "- " .. r.key .. ": " .. r.value:gsub("[\r\n]+", " ") .. "\n"
    if size + #line > R.LIMITS.promptChars then break end
    parts[#parts + 1] = line
    size = size + #line
  end
  return size
end

-- memory{db, visibility} -> rich mode's `memory` option. With "private"
-- (the default) the block holds the reader's private notes and the
-- channel's shared ones; with "shared" (the block is declared public to the
-- party) it holds the shared notes only, so nobody's private row can reach
-- a block that taints no reader record.
function M.memory(o)
  local db = db_of(o, "memory")
  local vis = o.visibility == nil and "private" or o.visibility
  if not VIS[vis] then opt_fail(VIS_RULE) end
  return {
    visibility = vis,
    promptBlock = function(channel, id, _name, principalId)
      local owner = R.owner(id, principalId)
      if not text_ok(channel, 1, R.LIMITS.ident) or not owner then
        error(errors.PG_IDENTITY, 0)
      end
      db:_live()
      local n = tostring(R.LIMITS.promptRows)
      local parts, size = {}, 0
      size = add_lines(parts, size, "Notes shared in this channel:",
        db:exec_max(R.LIMITS.promptRows, SHARED_ROWS, channel, n))
      if vis == "private" then
        add_lines(parts, size, "Your private notes:",
          db:exec_max(R.LIMITS.promptRows, PRIVATE_ROWS, channel, owner, n))
      end
      return table.concat(parts)
    end,
  }
end


return M
