-- rich/_attachments.lua: collecting a chat message's attachments on the host
-- (spec/rich-mode.md 16.4), `sandbox.rich.collectAttachments`:
--
--   collect(message, dir, {prepareImage, fetchImpl?, signal?, describeFailure?})
--     -> {files = {{name, file, path, contentType, size, fromReference}},
--         failures = {{name, fromReference, reason}}, images = {<prepareImage answers>}}
--
-- `dir` goes through ownDirectory and is then opened once, O_DIRECTORY|
-- O_NOFOLLOW; every file is created relative to that descriptor with
-- O_CREAT|O_EXCL|O_NOFOLLOW (core.dir_open), so a planted link or an existing
-- file fails only its own entry and nothing is written through it. Downloads
-- go through safe fetch (maxBytes 25 MiB) unless a trusted offline fetchImpl
-- is given. Images are prepared from the bytes just downloaded; nothing is
-- ever read back from a guest path. Yields (call from a task).
local channel = require "sandbox.rich._channel"
local core = require "sandbox.core"
local fetch = require "sandbox.fetch"
local text = require "sandbox.rich._text"

local M = {}

local MiB = 1024 * 1024
M.MAX_ATTACHMENTS = 10
M.MAX_BYTES = 25 * MiB
M.MAX_TOTAL = 50 * MiB
M.MAX_IMAGES = 4
M.NAME_KEEP = 120
M.IMAGE_MIME = { ["image/png"] = true, ["image/jpeg"] = true, ["image/gif"] = true, ["image/webp"] = true }

M.TOO_MANY = "too many attachments"
M.TOO_MUCH = "attachments exceed 50 MB in total"
M.BAD_ID = "Invalid message id"
M.NOT_SAVED = "the file could not be saved"
M.NOT_DECODED = "the image could not be decoded"

-- A refusal carries its own text (step 4's "else the refusal's own text").
local Refusal = {}
local function refuse(msg) error(setmetatable({ message = msg }, Refusal), 0) end
local function larger(n) return ("larger than 25 MB (%d bytes)"):format(n) end

-- Step 8: NFC, "/", "\" and control characters to "_", leading dots to
-- "_", the last 120 characters, or "file".
function M.file_name(name)
  local s = type(name) == "string" and core.utf8_nfc(name) or nil
  if not s then return "file" end
  local out = {}
  for _, cp in utf8.codes(s) do
    if cp == 0x2F or cp == 0x5C or cp < 0x20 or (cp >= 0x7F and cp <= 0x9F) then cp = 0x5F end
    out[#out + 1] = utf8.char(cp)
  end
  local i = 1
  while out[i] == "." do out[i] = "_"; i = i + 1 end
  if #out > M.NAME_KEEP then out = table.move(out, #out - M.NAME_KEEP + 1, #out, 1, {}) end
  if #out == 0 then return "file" end
  return table.concat(out)
end

-- The body of a fetchImpl answer (a string, or an iterator ending in nil),
-- at most max+1 bytes read.
local function bounded_body(body, max)
  if type(body) == "string" then return body end
  if type(body) ~= "function" then return "" end
  local parts, n = {}, 0
  for chunk in body do
    parts[#parts + 1] = chunk
    n = n + #chunk
    if n > max then break end
  end
  return table.concat(parts)
end

local function header(h, name)
  for k, v in pairs(h or {}) do
    if type(k) == "string" and k:lower() == name and type(v) == "string" then return v end
  end
  return nil
end

-- Steps 4-5: {status, headers, data}.
local function download(url, opts)
  if opts.fetchImpl then
    local r = opts.fetchImpl { method = "GET", url = url, headers = {}, signal = opts.signal }
    if type(r) ~= "table" then error("the fetch seam answered nothing", 0) end
    return { status = r.status, headers = r.headers or {}, data = bounded_body(r.body, M.MAX_BYTES) }
  end
  local ok, r = pcall(fetch.safe_fetch, url, { maxBytes = M.MAX_BYTES, signal = opts.signal })
  if not ok then
    if type(r) == "table" and r.name == "ResponseTooLargeError" then refuse(larger(M.MAX_BYTES + 1)) end
    error(r, 0)
  end
  return r
end

local function media_type(ct)
  local m = (ct or ""):match("^[^;]*"):lower()
  return (m:gsub("^%s+", ""):gsub("%s+$", ""))
end

-- The combined list of step 2.
local function entries(message)
  local list = {}
  local function add(atts, prefix, from_ref)
    if type(atts) ~= "table" then return end
    for i, a in ipairs(atts) do
      list[#list + 1] = { att = a, prefix = prefix, index = i - 1, fromReference = from_ref }
    end
  end
  local id = tostring(message.id)
  add(message.attachments, id, false)
  add(type(message.reference) == "table" and message.reference.attachments, id .. "-ref", true)
  return list
end

function M.collect(message, dir, opts)
  opts = opts or {}
  if type(message) ~= "table" then error("Invalid message", 0) end
  channel.own_directory(dir)                                                         -- 1
  local handle, err = core.dir_open(dir)
  if not handle then error("Attachment directory unavailable: " .. tostring(err), 0) end
  local out = { files = {}, failures = {}, images = {} }
  local total = 0
  local ok, e = pcall(function()
    for pos, en in ipairs(entries(message)) do
      if opts.signal and opts.signal.aborted then break end                          -- 3.1
      local a = type(en.att) == "table" and en.att or {}
      local function fail(reason)
        out.failures[#out.failures + 1] = { name = a.name, fromReference = en.fromReference, reason = reason }
      end
      local good, why = pcall(function()
        if pos > M.MAX_ATTACHMENTS then refuse(M.TOO_MANY) end                       -- 3.2
        if math.type(a.size) and a.size > M.MAX_BYTES then refuse(larger(a.size)) end -- 3.3
        if type(a.url) ~= "string" then refuse("download failed: no URL") end
        local r = download(a.url, opts)                                              -- 3.4
        if type(r.status) ~= "number" or r.status < 200 or r.status > 299 then       -- 3.5
          refuse(("download failed with HTTP %s"):format(tostring(r.status)))
        end
        local bytes = r.data or ""
        if #bytes > M.MAX_BYTES then refuse(larger(#bytes)) end                       -- 3.6
        if total + #bytes > M.MAX_TOTAL then refuse(M.TOO_MUCH) end
        if not en.prefix:find("^[a-zA-Z0-9_-]+$") or #en.prefix > 160 then refuse(M.BAD_ID) end  -- 3.7
        local file = ("%s-%d-%s"):format(en.prefix, en.index, M.file_name(a.name))   -- 3.8
        if not handle:write_new(file, bytes, 384) then refuse(M.NOT_SAVED) end        -- 3.9
        total = total + #bytes
        local ct = (type(a.contentType) == "string" and a.contentType ~= "" and a.contentType)
          or header(r.headers, "content-type") or "application/octet-stream"
        out.files[#out.files + 1] = {                                                -- 3.10
          name = a.name, file = file, path = dir .. "/" .. file, contentType = ct, size = #bytes,
          fromReference = en.fromReference,
        }
        local mime = media_type(ct)
        if #out.images < M.MAX_IMAGES and M.IMAGE_MIME[mime] and opts.prepareImage then  -- 3.11
          local pok, img = pcall(opts.prepareImage, bytes, mime)
          if pok and img ~= nil then out.images[#out.images + 1] = img
          else fail((opts.describeFailure and opts.describeFailure(img)) or M.NOT_DECODED) end
        end
      end)
      if not good then                                                                -- 4
        local described = opts.describeFailure and opts.describeFailure(why)
        if described then fail(described)
        elseif getmetatable(why) == Refusal then fail(why.message)
        else fail("download failed: " .. core.scrub_diagnostic(text.error_text(why), 600)) end
      end
    end
  end)
  handle:close()
  if not ok then error(e, 0) end
  return out
end

return M
