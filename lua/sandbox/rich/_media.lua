-- rich/_media.lua: the media and name bounds of spec/rich-mode.md 16.1-16.3,
-- shared by runTurn (turn images, reply files), the broker's result packet
-- (10.5 step 5), host tool images (12) and the Anthropic image blocks
-- (11.1). Each check returns true, or nil and the section's error text.
--
--   media.safe_name(s)             16.3: 1-255 code points, no / \ or
--                                  control characters, not . or ..
--   media.check_image(img)         one {data, mimeType} -> decoded bytes | nil, err
--   media.check_images(list)       16.1 -> true | nil, err
--   media.check_files(list)        16.2 -> true | nil, err
--   media.decode_files(list)       16.2 again, then {{name, data=<bytes>}} | nil, err
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local M = {}

local MiB = 1024 * 1024

M.MIME = { ["image/png"] = true, ["image/jpeg"] = true, ["image/webp"] = true, ["image/gif"] = true }
M.MAX_IMAGES = 8
M.MAX_IMAGE_B64 = 27962028
M.MAX_IMAGE_BYTES = 20 * MiB
M.MAX_IMAGES_BYTES = 64 * MiB
M.MAX_FILES = 10
M.MAX_FILE_B64 = 13981016
M.MAX_FILE_BYTES = 10 * MiB
M.MAX_FILES_BYTES = 50 * MiB
M.MAX_NAME = 255

function M.safe_name(s)
  if type(s) ~= "string" or s == "." or s == ".." then return false end
  local n = utf8.len(s)
  if not n or n < 1 or n > M.MAX_NAME then return false end
  if s:find("[/\\%c\127]") then return false end
  for _, cp in utf8.codes(s) do
    if cp >= 0x80 and cp <= 0x9F then return false end
  end
  return true
end

-- Decoded length of base64 text that passed `b64_shape`.
local function decoded_length(s)
  local pad = s:sub(-2) == "==" and 2 or (s:sub(-1) == "=" and 1 or 0)
  return #s // 4 * 3 - pad
end

-- The wire shape of 16.1/16.2: a multiple of 4 long, ^[A-Za-z0-9+/]*={0,2}$.
function M.b64_shape(s, max)
  return type(s) == "string" and #s <= max and #s % 4 == 0 and s:find("^[A-Za-z0-9+/]*=?=?$") ~= nil
end

-- One image: returns its decoded size, or nil and the error.
function M.image_size(img)
  if json.kind(img) ~= "object" then return nil, errors.RICH_IMAGE end
  if type(img.mimeType) ~= "string" or not M.MIME[img.mimeType] then return nil, errors.RICH_IMAGE end
  if not M.b64_shape(img.data, M.MAX_IMAGE_B64) then return nil, errors.RICH_IMAGE end
  local n = decoded_length(img.data)
  if n < 1 or n > M.MAX_IMAGE_BYTES then return nil, errors.RICH_IMAGE_BUDGET end
  return n
end

-- An image block's base64 source (11.1) checked like a turn image.
function M.check_image(img)
  local n, err = M.image_size(img)
  if not n then return nil, err end
  return true
end

function M.check_images(list)
  if list == nil then return true end
  if json.kind(list) ~= "array" and not (type(list) == "table" and next(list) == nil) then
    return nil, errors.RICH_IMAGE
  end
  if #list > M.MAX_IMAGES then return nil, errors.RICH_IMAGES end
  local total = 0
  for i = 1, #list do
    local n, err = M.image_size(list[i])
    if not n then return nil, err end
    total = total + n
    if total > M.MAX_IMAGES_BYTES then return nil, errors.RICH_IMAGE_BUDGET end
  end
  return true
end

function M.check_files(list)
  if json.kind(list) ~= "array" and not (type(list) == "table" and next(list) == nil) then
    return nil, errors.RICH_FILE
  end
  if #list > M.MAX_FILES then return nil, errors.RICH_FILES end
  local total = 0
  for i = 1, #list do
    local f = list[i]
    if json.kind(f) ~= "object" or not M.safe_name(f.name) then return nil, errors.RICH_FILE end
    if not M.b64_shape(f.data, M.MAX_FILE_B64) or f.data == "" then return nil, errors.RICH_FILE end
    local n = decoded_length(f.data)
    if n > M.MAX_FILE_BYTES then return nil, errors.RICH_FILE_BUDGET end
    total = total + n
    if total > M.MAX_FILES_BYTES then return nil, errors.RICH_FILE_BUDGET end
  end
  return true
end

function M.decode_files(list)
  local ok, err = M.check_files(list)
  if not ok then return nil, err end
  local out = {}
  for i = 1, #list do
    local bytes = core.base64_decode(list[i].data)
    if not bytes or #bytes == 0 then return nil, errors.RICH_FILE end
    out[i] = { name = list[i].name, data = bytes }
  end
  return out
end

return M
