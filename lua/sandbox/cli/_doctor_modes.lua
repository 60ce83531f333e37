-- cli/_doctor_modes.lua: what `sbx doctor` checks for a rich-mode config
-- (`return sandbox.rich { ... }`, spec/rich-mode.md 3) and for a precheck
-- runner's (`return sandbox.precheckScriptRunner { ... }`, precheck.md 2.1).
-- Their construction checks already ran when the config built the value (the
-- same code as the host that embeds it, in the same words); this adds what a
-- first turn or run needs from the host: the private directory, the daemon
-- and the image, each FAIL with its fix. Nothing is started.
--
--   modes.rich(r, rt, ctx)      r: doctor's reporter; rt: the rich runtime
--   modes.precheck(r, runner, ctx)
--   ctx = {path, no_docker, daemon = function(r) -> docker driver | nil}
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local layout = require "sandbox.runtime.layout"
local options = require "sandbox.runtime._options"

local M = {}

M.RICH_IMAGE_TARGET = "image-pi"
M.PRECHECK_IMAGE_TARGET = "image"

-- The command that builds an image of this tree (`make -C <checkout> TARGET`).
M.build_fix = layout.make_fix

-- A directory the host keeps private: owned by this account, no group or
-- other bits.
local function private_dir(r, name, dir, message, fix)
  local st = core.fs_stat(dir)
  local uid = core.getuid()
  if not st or st.type ~= "dir" then
    r.fail(name, message, dir .. " is not a directory", fix)
  elseif st.uid ~= uid then
    r.fail(name, message, string.format("%s is owned by uid %d", dir, st.uid), fix)
  elseif st.mode & tonumber("077", 8) ~= 0 then
    r.fail(name, message, string.format("%s has mode %04o (group/other bits set)", dir, st.mode & tonumber("7777", 8)), fix)
  else
    r.ok(name, dir .. " (private, owned by uid " .. uid .. ")")
  end
end

local function image_check(r, docker, image, target, what)
  if docker:inspect_image(image) then
    r.ok("image", image .. " present")
  else
    r.fail("image", what, image .. " (the first turn would fail)", M.build_fix(target))
  end
end

function M.rich(r, rt, ctx)
  local o = rt.o
  r.ok("options", "rich mode (spec/rich-mode.md 3): every construction check passed")
  private_dir(r, "partyDir", o.partyDir, errors.RICH_PRIVATE,
    errors.fix(errors.RICH_PRIVATE, { partyDir = options.shq(o.partyDir), user = ctx.user }))
  local longest = o.partyDir .. "/" .. string.rep("x", 8) .. "/run/broker.sock"
  if #longest > 100 then
    r.fail("socket path", errors.RICH_SOCKET, o.partyDir, errors.fix(errors.RICH_SOCKET))
  else
    r.ok("socket path", "partyDir leaves " .. (100 - #o.partyDir - #"//run/broker.sock") .. " bytes for a channel")
  end
  if ctx.no_docker then
    r.skip("docker", "--no-docker")
    return
  end
  if type(rt.driver.socket) ~= "string" then
    r.skip("docker", "a custom driver (no Docker socket): the host's driver owns the containers")
    return
  end
  local docker = ctx.daemon(r)
  if not docker then return end
  image_check(r, docker, o.image, M.RICH_IMAGE_TARGET, "rich worker image is missing")
end

function M.precheck(r, facts, ctx)
  r.ok("options", "precheck runner (spec/precheck.md 2.1): every construction check passed")
  private_dir(r, "runRoot", facts.runRoot, errors.ROOT_PRIVATE, errors.fix(errors.ROOT_PRIVATE, ctx.fix_ctx))
  if ctx.no_docker then
    r.skip("docker", "--no-docker")
    return
  end
  local docker = ctx.daemon(r)
  if not docker then return end
  image_check(r, docker, facts.image, M.PRECHECK_IMAGE_TARGET, "precheck image is missing")
end

return M
