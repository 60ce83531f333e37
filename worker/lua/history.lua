-- history.lua: recent conversation in <workspace>/history.json
-- (spec/worker.md 8.3, 8.5): at most 20 finished {role, content} entries,
-- each bounded to 8 KiB; never tool calls or results.
local sbxw = require "sbxw"
local codec = require "codec"
local text = require "text"

local M = {}

M.MAX_ENTRIES = 20
M.ENTRY_BUDGET = 8192
M.MAX_FILE_BYTES = 16 * 1024 * 1024

function M.message(role, content)
  return codec.object({ "role", "content" }, { role = role, content = content })
end

local function path_of(workspace)
  return workspace .. "/history.json"
end

-- load(workspace, reset) -> list of messages, or nil, "invalid history".
-- With reset the file is neither read nor validated.
function M.load(workspace, reset)
  if reset then return {} end
  local bytes, err = sbxw.read_file(path_of(workspace), M.MAX_FILE_BYTES)
  if bytes == nil then
    if err == "missing" then return {} end
    return nil, "invalid history"
  end
  local list = codec.decode(bytes)
  if not codec.is_array(list) or #list > M.MAX_ENTRIES then return nil, "invalid history" end
  local out = {}
  for i = 1, #list do
    local e = list[i]
    if not codec.is_object(e) or (e.role ~= "user" and e.role ~= "assistant")
       or type(e.content) ~= "string" then
      return nil, "invalid history"
    end
    out[i] = M.message(e.role, text.prompt_text(e.content, M.ENTRY_BUDGET))
  end
  return out
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
