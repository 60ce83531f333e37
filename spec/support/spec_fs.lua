-- spec_fs.lua: the shell and file helpers the specs and spec harnesses
-- share: run a command, quote for the shell, make and remove private temp
-- dirs, read, write and probe files, poll inside a task, and mark a case
-- pending when the runtime would refuse the current uid (root).
local async = require "sandbox.async"
local core = require "sandbox.core"

local M = {}

-- The command's stdout without trailing white space, and its exit code (0
-- on success).
function M.run(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local ok, _, code = p:close()
  return (out:gsub("%s+$", "")), ok and 0 or code
end

-- The command's stdout without trailing white space.
function M.sh(cmd) return (M.run(cmd)) end

-- s single-quoted for the shell.
function M.q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- $TMPDIR when it is set and short enough for the socket budget, else /tmp.
function M.short_tmp()
  local base = os.getenv("TMPDIR")
  if base == nil or base == "" or #base > 40 then base = "/tmp" end
  return base
end

local function under(dir, base, prefix)
  local head = base .. "/" .. prefix .. "-"
  return dir:sub(1, #head) == head
end

-- A fresh 0700 directory <base>/<prefix>-XXXXXX (base defaults to /tmp),
-- canonicalised. With a list, it is appended there (the spec removes the
-- listed dirs with M.rmdirs in teardown); without one the spec removes it
-- itself (M.rmdir).
function M.tmpdir(prefix, list, base)
  base = base or "/tmp"
  local dir = M.sh("mktemp -d " .. M.q(base .. "/" .. prefix .. "-XXXXXX"))
  assert(under(dir, base, prefix), "mktemp failed")
  os.execute("chmod 700 " .. M.q(dir))
  dir = assert(core.realpath(dir))
  if list then list[#list + 1] = dir end
  return dir
end

-- Removes dir, made writable first (a spec may leave read-only parts);
-- with a prefix, only a /tmp/<prefix>-* dir.
function M.rmdir(dir, prefix)
  if prefix then assert(under(dir, "/tmp", prefix), "not a spec temp dir: " .. dir) end
  os.execute("chmod -R u+rwx " .. M.q(dir) .. " 2>/dev/null; rm -rf " .. M.q(dir))
end

-- Removes every dir of a M.tmpdir list.
function M.rmdirs(list)
  for _, dir in ipairs(list) do M.rmdir(dir) end
end

-- The file's bytes, or nil when it cannot be opened.
function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- Writes bytes to path (replacing it); with a mode, chmods it after.
function M.write(path, bytes, mode)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
  if mode then os.execute("chmod " .. mode .. " " .. M.q(path)) end
end

function M.exists(path) return core.fs_lstat(path) ~= nil end

-- The permission bits as stat prints them ("600").
function M.mode(path) return M.sh("stat -c %a " .. M.q(path)) end

-- Inside a task: waits until pred() holds, polling every 5 ms, up to 5 s.
function M.wait_for(pred, what)
  local deadline = core.now() + 5000
  while not pred() do
    if core.now() > deadline then error("timed out waiting for " .. (what or "condition"), 2) end
    async.sleep(5)
  end
end

-- This process's pid (for fixtures that exit once their parent is gone).
function M.own_pid()
  local f = io.open("/proc/self/stat", "r")
  if not f then return nil end
  local line = f:read("l")
  f:close()
  return line and tonumber(line:match("^(%d+)"))
end

-- false (and the case pending) when running as root, which the runtime
-- refuses. pending_fn is the spec's busted `pending`.
function M.service_account(pending_fn)
  if core.getuid() == 0 then
    pending_fn("needs a non-root account: the runtime refuses uid 0 (run as sbx, as make check does)")
    return false
  end
  return true
end

return M
