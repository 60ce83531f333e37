-- runtime/_seccomp.lua: the sealed container's seccomp profile
-- (shared/spec/hardening.md 1). The profile is the project's own allow-list,
-- worker/seccomp.json, shipped with the worker image's build context; the
-- runtime reads it once at startup and every container of the runtime runs
-- under it: the CLI driver passes `--security-opt seccomp=<absolute path>`,
-- the Engine API driver `SecurityOpt` "seccomp=<the JSON>" (what the docker
-- CLI itself sends for that flag). There is never a fallback to Docker's
-- default profile: a missing, unreadable or malformed profile fails startup.
--
--   seccomp.default_path()  -> the shipped profile of this Lua tree's layout
--                              (<checkout>/worker/seccomp.json, ...), or nil
--   seccomp.load(path) / seccomp.count(profile) / seccomp.forget([path])
--                              the profile file as the drivers read it
--                              (drivers/_seccomp.lua, re-exported here)
local layout = require "sandbox.runtime.layout"
local profile = require "sandbox.drivers._seccomp"

local M = {}

M.FILE = "seccomp.json"

-- The shipped profile: in the worker image's build context of this Lua
-- tree's layout (sandbox.runtime.layout: <checkout>/worker/, an installed
-- <prefix>/share/pi-roundtable-sandbox/, the Bun package's worker/), or, for
-- a luarocks tree (no build context), beside the modules in sandbox/.
function M.default_path()
  local b = layout.image_build()
  if b.kind == "checkout" then return b.dir .. "/worker/" .. M.FILE end
  if b.dir then return b.dir .. "/" .. M.FILE end
  local t = layout.tree()
  return t and (t .. "/sandbox/" .. M.FILE) or nil
end

M.MAX_BYTES = profile.MAX_BYTES
M.count, M.load, M.forget = profile.count, profile.load, profile.forget

return M
