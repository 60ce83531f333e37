-- broker_client.lua: the default broker function of the turn entry
-- (spec/worker.md 1.1, 4.2-4.3): one POST over the Unix socket through
-- sbxw.broker_request, then the status check.
--
--   request(route, body_bytes) -> 200, decoded value
--                               -> status, {error="broker refused"}  (any other status)
--                               -> nil, message  (transport, too large, no JSON)
local sbxw = require "sbxw"
local codec = require "codec"

local M = {}

function M.refused()
  return codec.object({ "error" }, { error = "broker refused" })
end

-- The result of one exchange given what the wire gave: status and body
-- bytes, or nil and the transport message.
function M.interpret(status, data)
  if status == nil then return nil, data or "transport" end
  if status ~= 200 then return status, M.refused() end
  local value = codec.decode(data)
  if value == nil then return nil, "broker returned no JSON" end
  return 200, value
end

function M.request(route, body)
  return M.interpret(sbxw.broker_request(route, body))
end

-- Wraps a broker function into the loop's use (4.3): the decoded 200 body,
-- or nil and `broker refused` / the transport message.
function M.caller(broker)
  return function(route, body)
    local status, value = broker(route, body)
    if status == nil then return nil, value or "transport" end
    if status ~= 200 then return nil, "broker refused" end
    return value
  end
end

return M
