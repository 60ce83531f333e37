-- rich/_channel.lua: a channel's directory under partyDir (spec/rich-mode.md
-- 4): its segment, layout, the alias guard every lifecycle, session and
-- attachment lookup runs, ownDirectory, the start-time directory checks of
-- section 6 steps 2-3, and startFresh's session archive. Synchronous
-- syscalls through the core (no-follow creation, lstat, realpath).
--
--   channel.segment(key)          -> segment (raises for a bad or long key)
--   channel.paths(partyDir, key)  -> {root, key_file, run, socket, workspace,
--                                     attachments, outbox, sessions}
--   channel.guard(paths, key)     the alias guard (4), after a missing root is made
--   channel.prepare(paths)        section 6 steps 2-3 (directories 0700, real paths)
--   channel.own_directory(path)   a real directory at path, never following a link
--   channel.archive_sessions(paths, now) -> how many files were archived
local core = require "sandbox.core"
local errors = require "sandbox.errors"

local M = {}

M.MAX_KEY_CHARS = 256
M.MAX_KEY_READ = 1025
M.MAX_SOCKET_PATH = 100
local DIR_MODE = tonumber("700", 8)
local KEY_MODE = tonumber("600", 8)

local function fail(msg) error(msg, 0) end

-- Every code point outside [A-Za-z0-9_-] becomes "_".
function M.segment(key)
  if type(key) ~= "string" or key == "" then fail(errors.RICH_CHANNEL) end
  local n = utf8.len(key)
  if not n then fail(errors.RICH_CHANNEL) end
  if n > M.MAX_KEY_CHARS then fail(errors.RICH_CHANNEL_LONG) end
  local out = {}
  for _, cp in utf8.codes(key) do
    local c = cp < 128 and string.char(cp) or ""
    out[#out + 1] = c:find("^[A-Za-z0-9_-]$") and c or "_"
  end
  return table.concat(out)
end

function M.paths(party_dir, key)
  local root = party_dir .. "/" .. M.segment(key)
  local ws = root .. "/workspace"
  return {
    segment = root:sub(#party_dir + 2), root = root, key_file = root .. "/.channel-key",
    run = root .. "/run", socket = root .. "/run/broker.sock", workspace = ws,
    attachments = ws .. "/attachments", outbox = ws .. "/outbox", sessions = ws .. "/sessions",
  }
end

-- The alias guard (4). A root that does not exist yet is created (0700) so
-- its .channel-key can claim the segment for this key.
function M.guard(p, key)
  if not core.fs_lstat(p.root) then core.fs_mkdir(p.root, DIR_MODE) end
  if core.realpath(p.root) ~= p.root then fail(errors.RICH_ROOT_LINK) end     -- 1
  local ok, _, code = core.write_file_new(p.key_file, key, KEY_MODE)          -- 2
  if not ok and code ~= "EEXIST" then fail(errors.RICH_ALIAS) end
  local got = core.read_file_nofollow(p.key_file, M.MAX_KEY_READ)             -- 3
  if got ~= key then fail(errors.RICH_ALIAS) end
  if #p.socket > M.MAX_SOCKET_PATH then fail(errors.RICH_SOCKET) end
end

-- ownDirectory (4): lstat; anything but a directory is unlinked (a link is
-- removed, never followed); then a 0700 directory.
function M.own_directory(path)
  local st = core.fs_lstat(path)
  if st and st.type ~= "dir" then core.fs_rmtree(path) end
  if not (st and st.type == "dir") then core.fs_mkdir(path, DIR_MODE) end
end

local function real(path)
  if core.realpath(path) ~= path then fail(errors.RICH_DIR_LINK) end
end

-- Section 6, steps 2-3.
function M.prepare(p)
  for _, d in ipairs { p.root, p.run, p.workspace } do
    local st = core.fs_lstat(d)
    if not st then core.fs_mkdir(d, DIR_MODE) end
    real(d)
  end
  for _, d in ipairs { p.attachments, p.outbox, p.sessions } do M.own_directory(d) end
  for _, d in ipairs { p.attachments, p.outbox, p.sessions } do real(d) end
end

-- "<UTC ISO-8601 time with ':' replaced by '-'>" for an epoch second.
function M.stamp(now)
  return os.date("!%Y-%m-%dT%H-%M-%SZ", now)
end

-- startFresh's archive (6): plain top-level *.jsonl files move into
-- sessions/archive/<stamp>/ (both levels through own_directory); a
-- sessions that is not a real directory is replaced by an empty one.
function M.archive_sessions(p, now)
  local st = core.fs_lstat(p.sessions)
  if not st or st.type ~= "dir" then
    M.own_directory(p.sessions)
    return 0
  end
  local names = {}
  for _, name in ipairs(core.fs_readdir(p.sessions) or {}) do
    if name:sub(-6) == ".jsonl" then
      local e = core.fs_lstat(p.sessions .. "/" .. name)
      if e and e.type == "file" then names[#names + 1] = name end
    end
  end
  table.sort(names)
  local archive = p.sessions .. "/archive"
  M.own_directory(archive)
  real(archive)
  if #names == 0 then return 0 end
  local base = archive .. "/" .. M.stamp(now or os.time())
  local dir, n = base, 1
  while core.fs_lstat(dir) do n = n + 1; dir = base .. "-" .. n end
  M.own_directory(dir)
  real(dir)
  local moved = 0
  for _, name in ipairs(names) do
    if os.rename(p.sessions .. "/" .. name, dir .. "/" .. name) then moved = moved + 1 end
  end
  return moved
end

return M
