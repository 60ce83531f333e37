-- budget.lua: fitting a /model request under 192 KiB (spec/worker.md 8.4).
local codec = require "codec"

local M = {}

M.MAX_PAYLOAD = 196608

-- fit(payload, user_msg) -> body bytes, or nil, error. payload.messages is
-- trimmed in place (deletions hold for the rest of the turn): history leaves
-- one message at a time, oldest first, then whole tool groups (an assistant
-- message with the tool messages after it). The system message (first) and
-- user_msg, recognized by identity, are never removed.
function M.fit(payload, user_msg)
  local msgs = payload.messages
  while true do
    local body = codec.encode(payload)
    if #body <= M.MAX_PAYLOAD then return body end
    if msgs[2] ~= user_msg then
      table.remove(msgs, 2)
    elseif #msgs > 2 then
      table.remove(msgs, 3)
      while msgs[3] ~= nil and msgs[3].role == "tool" do table.remove(msgs, 3) end
    else
      return nil, "model context exceeds request budget"
    end
  end
end

return M
