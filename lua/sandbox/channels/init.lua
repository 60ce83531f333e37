-- channels/init.lua: the channel store, i.e. which channel keys are in sandbox
-- mode (spec/runtime.md 3.2 steps 4-6, 3.3, 7.1-7.3). Host-only routing
-- state: the file is never mounted into a container.
--
--   local channels = require "sandbox.channels"
--   local path = channels.state_path(stateFile, runRoot, workspaceRoot)
--   local store = channels.open { stateFile = path, initialChannels = {...} }
--   store:has(key)     store:list() -> a copy, insertion order
--   store:enable(key)  store:disable(key)     (persist; raise on failure)
--
-- The file is a compact JSON array of keys in insertion order, e.g.
-- `["discord:123456789","fake:guests"]`. Every enable/disable rewrites it
-- atomically (core.write_file_atomic: <stateFile>.tmp 0600 no-follow, write,
-- fsync, rename, fsync of the directory), even when nothing changed; a failed
-- write (a full filesystem: shared/spec/hardening.md 3) loses nothing: the
-- old file stays valid, the in-memory change is rolled back, `routing state
-- could not be saved` is raised and the operator log gets the line
-- `routing state could not be saved reason=state_write_failed errno=<E...>
-- fix=...` (error). A corrupt or unreadable file stops startup: the state is
-- never treated as empty. Turning a channel off touches no workspace file: its
-- memory stays for when it is turned on again.
local channel_key = require "sandbox.channels._key"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local M = {}

M.MAX_FILE_BYTES = 1048576
M.LOG_SAVE = errors.STATE_SAVE
M.MAX_DEPTH = 64

M.E_INVALID_STATE = errors.STATE_INVALID
M.E_CHANNEL = channel_key.E_INVALID
M.E_SAVE = errors.STATE_SAVE
M.E_DIR = errors.STATE_DIR
M.E_FILE = errors.STATE_FILE
M.E_ABSOLUTE = errors.STATE_ABSOLUTE
M.E_NAME = errors.STATE_NAME
M.E_MOUNTS = errors.STATE_MOUNTS

local DIR_MODE = tonumber("700", 8)
local PRIVATE_BITS = tonumber("077", 8)

local function fail(msg) error(msg, 0) end

-- The operator-facing form of a startup error: "<message>: <file>: <fix>",
-- the fix from sandbox.errors (the message itself stays the spec's exact
-- string, for logs and `sbx doctor`).
function M.explain(msg, path)
  local fix = errors.fix(msg)
  if not fix then return msg end
  return msg .. ": " .. tostring(path) .. ": " .. fix
end

-- Last path segment and the directory before it.
local function split(path)
  local dir, name = path:match("^(.*)/([^/]*)$")
  if dir == "" then dir = "/" end
  return dir, name
end

-- §3.2 steps 4-6: checks `stateFile`, creates its directory (0700) and
-- returns the canonical state path. `roots` are the canonical runRoot and
-- workspaceRoot; a state path equal to or under either is refused. dry
-- (`sbx doctor`): nothing is created; a missing directory is taken as given.
function M.state_path(state_file, run_root, workspace_root, dry)
  if type(state_file) ~= "string" or state_file:sub(1, 1) ~= "/" or state_file:find("\0", 1, true) then
    fail(M.E_ABSOLUTE)
  end
  local dir, name = split(state_file)
  if name == "" or name == "." or name == ".." then fail(M.E_NAME) end
  if not dry then core.fs_mkdir_p(dir, DIR_MODE) end              -- step 5
  local real = core.realpath(dir)
  if not real and dry and not core.fs_stat(dir) then real = dir end
  if not real then fail(M.E_DIR) end
  local path = (real == "/" and "" or real) .. "/" .. name        -- step 6
  for _, root in ipairs { run_root, workspace_root } do
    if type(root) == "string" and (path == root or path:sub(1, #root + 1) == root .. "/") then
      fail(M.E_MOUNTS)
    end
  end
  return path
end

-- Parses the file content or the seed: an array of keys in the grammar.
-- Duplicates collapse, first-seen order kept.
local function parse_list(list)
  local keys, seen = {}, {}
  for i = 1, #list do
    local k = list[i]
    if not channel_key.valid(k) then fail(M.E_INVALID_STATE) end
    if not seen[k] then
      seen[k] = true
      keys[#keys + 1] = k
    end
  end
  return keys, seen
end

local function decode(bytes)
  if not core.utf8_valid(bytes) then fail(M.E_INVALID_STATE) end
  local ok, v = pcall(json.decode, bytes)
  if not ok or json.kind(v) ~= "array" then fail(M.E_INVALID_STATE) end
  return v
end

local Store = {}
Store.__index = Store
M.Store = Store

-- Writes the current list; `write` is core.write_file_atomic or a spec's seam.
function Store:_save()
  local bytes = json.encode(json.array(table.move(self.keys, 1, #self.keys, 1, {})))
  if not bytes then return false end
  local ok, _, code = self.write(self.path, bytes)
  if ok == true then return true end
  if self.log then
    local why = errors.entry(M.E_SAVE).reason
    pcall(self.log, "error", M.LOG_SAVE, { reason = why, errno = code or "EIO", fix = errors.reason_fix(why) })
  end
  return false
end

-- §3.3 steps 1-5: the keys (and whether the file existed). dry (`sbx
-- doctor`): nothing is created; a missing directory is what startup creates.
function M.load(opts, dry)
  local path = opts.stateFile
  if type(path) ~= "string" or path:sub(1, 1) ~= "/" then fail(M.E_ABSOLUTE) end
  local dir = split(path)
  if not dry then core.fs_mkdir_p(dir, DIR_MODE) end              -- step 1
  local st = core.fs_stat(dir)                                    -- step 2
  if dry and not st then
    local keys, set = parse_list(opts.initialChannels or {})
    return keys, set, false
  end
  if not st or st.type ~= "dir" or st.uid ~= core.getuid() or (st.mode & PRIVATE_BITS) ~= 0 then
    fail(M.E_DIR)
  end
  local list, existed
  local lst, _, code = core.fs_lstat(path)                        -- step 3
  if lst then
    if lst.type ~= "file" or lst.uid ~= core.getuid() then fail(M.E_FILE) end
    local bytes, _, rcode = core.read_file_nofollow(path, M.MAX_FILE_BYTES)
    if not bytes then
      if rcode == "EFBIG" then fail(M.E_INVALID_STATE) end      -- over 1 MiB
      fail(M.E_FILE)
    end
    list, existed = decode(bytes), true                           -- step 4
  elseif code == "ENOENT" then
    local seed = opts.initialChannels
    if seed == nil then seed = {} end
    if type(seed) ~= "table" then fail(M.E_INVALID_STATE) end
    local n = 0
    for _ in pairs(seed) do n = n + 1 end
    if n ~= #seed then fail(M.E_INVALID_STATE) end
    list, existed = seed, false
  else
    fail(M.E_FILE)
  end
  local keys, set = parse_list(list)                              -- step 5
  return keys, set, existed
end

-- §3.3, exact order. opts = {stateFile = canonical path (state_path),
-- initialChannels = list|nil, write = seam|nil, log = function(level, msg,
-- fields) | nil (the operator log)}. Raises the spec's strings.
function M.open(opts)
  local path = opts.stateFile
  local keys, set, existed = M.load(opts)
  local self = setmetatable({
    path = path, keys = keys, set = set, write = opts.write or core.write_file_atomic, log = opts.log,
  }, Store)
  if not existed and not self:_save() then fail(M.E_SAVE) end     -- step 6
  return self
end

function Store:has(key)
  return self.set[key] == true
end

function Store:list()
  return table.move(self.keys, 1, #self.keys, 1, {})
end

-- Adds the key (at the end, when new) and persists; on a failed write the
-- key is removed again and `routing state could not be saved` is raised.
function Store:enable(key)
  if not channel_key.valid(key) then fail(M.E_CHANNEL) end
  local added = not self.set[key]
  if added then
    self.keys[#self.keys + 1] = key
    self.set[key] = true
  end
  if not self:_save() then
    if added then
      self.keys[#self.keys] = nil
      self.set[key] = nil
    end
    fail(M.E_SAVE)
  end
  return true
end

-- Removes the key and persists; on a failed write it is restored at its
-- old position. Workspace and memory files are never touched.
function Store:disable(key)
  local at
  for i, k in ipairs(self.keys) do
    if k == key then at = i break end
  end
  if at then
    table.remove(self.keys, at)
    self.set[key] = nil
  end
  if not self:_save() then
    if at then
      table.insert(self.keys, at, key)
      self.set[key] = true
    end
    fail(M.E_SAVE)
  end
  return true
end

return M
