-- memory.lua: the channel memory store (spec/worker.md section 7).
-- <workspace>/memory.json is a compact array of {scope, key, text}; scopes
-- are `channel` and `speaker:<id>`. Keys, texts and ids are data, never
-- paths. Every change is written atomically before the in-memory copy moves.
--
-- Self-healing (shared/spec/hardening.md 8, overriding worker.md 5.1 and
-- 7.2): a store that is not a valid memory.json (garbage, a FIFO, a
-- directory, a link, too large) is moved aside to
-- memory.json.invalid-<UTC time> (sbxw.move_aside: at most 3 kept) and the
-- turn starts with an empty store; open then reports `memory_store`.
-- Fairness inside a channel (hardening.md 5): one speaker holds at most 32
-- entries and 64 KiB of the channel's 256 entries / 512 KiB.
local sbxw = require "sbxw"
local codec = require "codec"
local text = require "text"

local M = {}

M.MAX_ENTRIES = 256
M.MAX_STORE_BYTES = 524288
M.MAX_FILE_BYTES = 16 * 1024 * 1024
M.MAX_KEY_CHARS = 128
M.MAX_TEXT_CHARS = 2048
M.MAX_SPEAKER_ENTRIES = 32
M.MAX_SPEAKER_BYTES = 65536
M.REASON = "memory_store"

local Store = {}
Store.__index = Store

local function entry(scope, key, value)
  return codec.object({ "scope", "key", "text" }, { scope = scope, key = key, text = value })
end

local function load(path)
  local bytes, err = sbxw.read_file(path, M.MAX_FILE_BYTES)
  if bytes == nil then
    if err == "missing" then return {} end
    return nil
  end
  local list = codec.decode(bytes)
  if not codec.is_array(list) or #list > M.MAX_ENTRIES then return nil end
  local entries = {}
  for i = 1, #list do
    local e = list[i]
    if not codec.is_object(e) or type(e.scope) ~= "string" or type(e.key) ~= "string"
       or type(e.text) ~= "string" then
      return nil
    end
    entries[i] = entry(e.scope, e.key, e.text)
  end
  return entries
end

-- open(workspace) -> store, repaired ("memory_store" when an invalid store
-- was moved aside, else nil); or nil, "invalid memory store" when it could
-- not be moved (or the mkdir error).
function M.open(workspace)
  local ok, err = sbxw.mkdir(workspace)
  if not ok then return nil, err or "workspace unavailable" end
  local path = workspace .. "/memory.json"
  local entries, repaired = load(path), nil
  if not entries then
    if not sbxw.move_aside(path) then return nil, "invalid memory store" end
    entries, repaired = {}, M.REASON
  end
  return setmetatable({ path = path, entries = entries }, Store), repaired
end

-- A speaker namespace's share of the channel's store (hardening.md 5): at
-- most MAX_SPEAKER_ENTRIES entries whose compact array is at most
-- MAX_SPEAKER_BYTES.
local function within_share(entries, ns)
  local own = codec.array()
  for _, e in ipairs(entries) do
    if e.scope == ns then own[#own + 1] = e end
  end
  return #own <= M.MAX_SPEAKER_ENTRIES and #codec.encode(own) <= M.MAX_SPEAKER_BYTES
end

-- The namespace and the trimmed key (nil for no key) of a call, or nil, error.
local function namespace(args, speaker_id)
  local scope = args.scope
  if scope ~= "speaker" and scope ~= "channel" then
    return nil, nil, "scope must be speaker or channel"
  end
  local ns = scope == "channel" and "channel" or ("speaker:" .. speaker_id)
  local key = args.key
  if type(key) ~= "string" then return ns, nil end
  key = text.trim(key)
  local n = text.len(key)
  if not n or n < 1 or n > M.MAX_KEY_CHARS then
    return nil, nil, "key must be 1 to 128 characters"
  end
  return ns, key
end

function Store:get(ns, key, query)
  local out = codec.array()
  for _, e in ipairs(self.entries) do
    if e.scope == ns and (key == nil or e.key == key)
       and text.lower(e.key .. " " .. e.text):find(query, 1, true) then
      out[#out + 1] = codec.object({ "key", "text" }, { key = e.key, text = e.text })
    end
  end
  return codec.encode(out)
end

-- run(name, args, speaker_id) -> result text, or nil, error (section 7.4).
-- args is a decoded object; the current speaker comes only from speaker_id.
function Store:run(name, args, speaker_id)
  local ns, key, err = namespace(args, speaker_id)
  if not ns then return nil, err end
  if name == "memory_get" then
    local query = type(args.query) == "string" and text.lower(args.query) or ""
    return self:get(ns, key, query)
  end
  if key == nil then return nil, "key is required" end
  if name ~= "memory_set" and name ~= "memory_remove" then return nil, "unknown memory tool" end
  local next_entries = codec.array()
  for _, e in ipairs(self.entries) do
    if not (e.scope == ns and e.key == key) then next_entries[#next_entries + 1] = e end
  end
  if name == "memory_set" then
    local value = args.text
    local n = type(value) == "string" and text.len(value)
    if not n or n > M.MAX_TEXT_CHARS or text.trim(value) == "" then
      return nil, "text must be 1 to 2048 characters"
    end
    next_entries[#next_entries + 1] = entry(ns, key, value)
  end
  local bytes = codec.encode(next_entries)
  if name == "memory_set" and (#next_entries > M.MAX_ENTRIES or #bytes > M.MAX_STORE_BYTES
      or (ns ~= "channel" and not within_share(next_entries, ns))) then
    return nil, "memory capacity reached"
  end
  local ok, werr = sbxw.write_file_atomic(self.path, bytes)
  if not ok then return nil, werr or "write failed" end
  self.entries = next_entries
  return name == "memory_set" and "Saved." or "Forgotten."
end

-- The preview of one scope: memory_get with no key and no query.
function Store:preview(scope, speaker_id)
  return assert(self:run("memory_get", { scope = scope }, speaker_id))
end

return M
