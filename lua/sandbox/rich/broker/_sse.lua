-- rich/broker/_sse.lua: the SSE error watch of spec/rich-mode.md 11.5, a
-- side parser over the raw chunks of a successful text/event-stream answer.
-- Events are cut at blank lines (\r?\n\r?\n); `event:` names one; each
-- `data:` line loses one leading space and the lines join with "\n". The
-- first event named `error`, or whose data is a JSON object of type "error",
-- is reported (once); an unfinished event over 64 KiB is thrown away. The
-- worker's bytes are never touched.
--
--   local w = sse.watch();  w.push(chunk) -> data of the first error event | nil
local json = require "sandbox.json"

local M = {}

M.MAX_EVENT = 65536

local function parse(event)
  local name, data = nil, {}
  for line in (event .. "\n"):gmatch("([^\n]*)\n") do
    line = line:gsub("\r$", "")
    local field, value = line:match("^([^:]*):?(.*)$")
    if line:find(":", 1, true) then value = value:gsub("^ ", "") else value = "" end
    if field == "event" then name = value
    elseif field == "data" then data[#data + 1] = value end
  end
  return name, table.concat(data, "\n")
end

local function is_error(name, data)
  if name == "error" then return true end
  if data:sub(1, 1) ~= "{" then return false end
  local v = json.decode(data)
  return json.kind(v) == "object" and v.type == "error"
end

function M.watch()
  local buf, skipping, done = "", false, false
  local w = {}
  function w.push(chunk)
    if done then return nil end
    buf = buf .. chunk
    while true do
      local a, b = buf:find("\r?\n\r?\n")
      if not a then break end
      local event = buf:sub(1, a - 1)
      buf = buf:sub(b + 1)
      if skipping then
        skipping = false
      else
        local name, data = parse(event)
        if is_error(name, data) then
          done = true
          buf = ""
          return data
        end
      end
    end
    if #buf > M.MAX_EVENT then
      buf = ""
      skipping = true
    end
    return nil
  end
  return w
end

return M
