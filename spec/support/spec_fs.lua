-- spec_fs.lua: the shell and file helpers several specs share: run a
-- command, make a private canonical temp dir, read a file, and mark a case
-- pending when the runtime would refuse the current uid (root).
local core = require "sandbox.core"

local M = {}

function M.sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return (out:gsub("%s+$", ""))
end

-- A fresh 0700 directory /tmp/<prefix>-XXXXXX, canonicalised, appended to
-- list (the spec removes the listed dirs in teardown).
function M.tmpdir(prefix, list)
  local dir = M.sh("mktemp -d /tmp/" .. prefix .. "-XXXXXX")
  assert(dir:find("^/tmp/" .. prefix:gsub("%-", "%%-") .. "%-"), "mktemp failed")
  os.execute("chmod 700 '" .. dir .. "'")
  dir = assert(core.realpath(dir))
  list[#list + 1] = dir
  return dir
end

function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
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
