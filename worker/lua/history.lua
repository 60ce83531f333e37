-- history.lua: recent conversation in <workspace>/history.json
-- (spec/worker.md 8.3, 8.5): at most 20 finished {role, content} entries,
-- each bounded to 8 KiB; never tool calls or results.
--
-- Self-healing (shared/spec/hardening.md 8, overriding worker.md 8.3): an
-- invalid history.json (garbage, a FIFO, a directory, a link) is moved
-- aside to history.json.invalid-<UTC time> and the turn starts with an
-- empty history; load then reports `history`. With reset the file is not
-- read, but anything other than a regular file in its place is moved aside
-- too, so the successful turn can write it.
local sbxw = require "sbxw"
local codec = require "codec"
local text = require "text"

local M = {}

M.MAX_ENTRIES = 20
M.ENTRY_BUDGET = 8192
M.MAX_FILE_BYTES = 16 * 1024 * 1024
M.REASON = "history"

function M.message(role, content)
  return codec.object({ "role", "content" }, { role = role, content = content })
end

local function path_of(workspace)
  return workspace .. "/history.json"
end

-- The entries of the file at path, {} when it is absent, or nil when it is
-- not a valid history.
local function read(path)
  local bytes, err = sbxw.read_file(path, M.MAX_FILE_BYTES)
  if bytes == nil then
    if err == "missing" then return {} end
    return nil
  end
  local list = codec.decode(bytes)
  if not codec.is_array(list) or #list > M.MAX_ENTRIES then return nil end
  local out = {}
  for i = 1, #list do
    local e = list[i]
    if not codec.is_object(e) or (e.role ~= "user" and e.role ~= "assistant")
       or type(e.content) ~= "string" then
      return nil
    end
    out[i] = M.message(e.role, text.prompt_text(e.content, M.ENTRY_BUDGET))
  end
  return out
end

-- load(workspace, reset) -> list of messages, repaired ("history" when an
-- invalid file was moved aside, else nil); or nil, "invalid history" when
-- it could not be moved. With reset the file is neither read nor validated.
function M.load(workspace, reset)
  local path = path_of(workspace)
  local kind = sbxw.entry_kind(path)
  if reset and (kind == "missing" or kind == "file") then return {} end
  local out = not reset and read(path) or nil
  if out then return out end
  if not sbxw.move_aside(path) then return nil, "invalid history" end
  return {}, M.REASON
end

-- save(workspace, loaded, wrapper, final_text) -> true, or nil, error.
function M.save(workspace, loaded, wrapper, final_text)
  local all = {}
  for _, m in ipairs(loaded) do all[#all + 1] = M.message(m.role, m.content) end
  all[#all + 1] = M.message("user", text.prompt_text(wrapper, M.ENTRY_BUDGET))
  all[#all + 1] = M.message("assistant", text.prompt_text(final_text, M.ENTRY_BUDGET))
  local keep = codec.array()
  for i = math.max(1, #all - M.MAX_ENTRIES + 1), #all do keep[#keep + 1] = all[i] end
  local ok, err = sbxw.write_file_atomic(path_of(workspace), codec.encode(keep))
  if not ok then return nil, err or "history write failed" end
  return true
end

return M
