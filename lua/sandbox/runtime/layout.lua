-- runtime/layout.lua: where this host Lua tree lives, and so the one command that
-- builds its worker image (spec/operations.md 5 "a missing image names the
-- project's own build command", 6). The tree is found from this file's own
-- path; four layouts:
--   checkout   <root>/lua/sandbox/        beside <root>/worker/worker.mk:
--                                         `make image` (in <root>)
--   installed  <prefix>/share/lua/5.4/    beside <prefix>/share/pi-roundtable-
--                                         sandbox/build-image (`make install`)
--   package    <pkg>/lua/                 beside <pkg>/worker/build-image (the
--                                         Bun package, bun pm pack)
--   modules    anything else (a luarocks tree): no build context here
--
--   layout.tree()              -> the directory holding sandbox/ (absolute when
--                                 it can be resolved)
--   layout.image_build()       -> {kind=, command=, dir=}: command builds
--                                 pi-roundtable-sandbox:local (nil for "modules")
--   layout.image_fix(image)    -> the operator's fix for a missing image
--   layout.make_fix(target)    -> the fix naming another image's make target
local core = require "sandbox.core"

local M = {}

M.IMAGE = "pi-roundtable-sandbox:local"
M.CONTEXT_DIR = "pi-roundtable-sandbox"   -- under <prefix>/share

local function exists(path)
  local f = io.open(path, "r")
  if not f then return false end
  f:close()
  return true
end

local function shq(s)
  if s:match("^[%w%./_%-:]+$") then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

function M.tree()
  local src = debug.getinfo(1, "S").source
  local dir = src:match("^@(.*)/sandbox/runtime/layout%.lua$")
    or src:match("^@(sandbox)/runtime/layout%.lua$") and "."
  if not dir then return nil end
  if dir == "" then dir = "/" end
  return core.realpath(dir) or dir
end

function M.image_build()
  local tree = M.tree()
  if not tree then return { kind = "modules" } end
  local parent = tree:match("^(.*)/[^/]+$") or "."
  if exists(parent .. "/worker/worker.mk") then
    return { kind = "checkout", dir = parent, command = "make -C " .. shq(parent) .. " image" }
  end
  if exists(parent .. "/worker/build-image") then
    local script = parent .. "/worker/build-image"
    return { kind = "package", dir = parent .. "/worker", command = shq(script) }
  end
  local share = tree:match("^(.*)/lua/5%.4$")
  if share and exists(share .. "/" .. M.CONTEXT_DIR .. "/build-image") then
    local script = share .. "/" .. M.CONTEXT_DIR .. "/build-image"
    return { kind = "installed", dir = share .. "/" .. M.CONTEXT_DIR, command = shq(script) }
  end
  return { kind = "modules" }
end

-- The fix for a missing image another make target builds (rich mode's
-- `image-pi`, the precheck image's `image`): that target in this checkout,
-- else where it is run.
function M.make_fix(target)
  local b = M.image_build()
  if b.kind == "checkout" then return "build it: make -C " .. shq(b.dir) .. " " .. target end
  return "build it from the engine's source tree: make " .. target
end

-- The fix printed for a missing image (image defaults to the default tag).
function M.image_fix(image)
  image = image or M.IMAGE
  local b = M.image_build()
  if not b.command then
    return "build " .. image .. " from the engine's source tree (make image" ..
      (image ~= M.IMAGE and (" SBX_IMAGE=" .. shq(image)) or "") .. ")"
  end
  if image == M.IMAGE then return b.command end
  if b.kind == "checkout" then return b.command .. " SBX_IMAGE=" .. shq(image) end
  return "SBX_IMAGE=" .. shq(image) .. " " .. b.command
end

return M
