-- rich/broker/_privacy.lua: the host rules of the capability handshake
-- (spec/rich-mode.md 14.1). The requirement is raised only by demand (a
-- private prompt, a ready with privateHistory=true, a host tool that returns
-- privateTo) and then stays set for the broker's life; while it is set, a
-- worker that did not declare both capabilities gets no private payload.
-- Capabilities detect trusted images of mixed versions, not a lying worker.
--
--   privacy.missing(caps)        -> "privateTo, readerRecords" | "privateTo" | ... | nil
--   privacy.problem(image, missing) -> the exact rebuild message
--   privacy.private_prompt(req)  -> the turn's prompt block is private
local errors = require "sandbox.errors"

local M = {}

M.CONFIGURED_IMAGE = "(configured image)"

function M.missing(caps)
  local out = {}
  if not (caps and caps.privateTo == true) then out[#out + 1] = "privateTo" end
  if not (caps and caps.readerRecords == true) then out[#out + 1] = "readerRecords" end
  if #out == 0 then return nil end
  return table.concat(out, ", ")
end

function M.problem(image, missing)
  local shown = (type(image) == "string" and image ~= "") and image or M.CONFIGURED_IMAGE
  return errors.RICH_REBUILD .. shown .. " lacks " .. missing
    .. "; rebuild this image with the installed core and sandbox packages"
end

function M.private_prompt(request)
  return type(request.memory) == "string" and request.memory ~= "" and request.memoryVisibility ~= "shared"
end

return M
