-- cli/cleanup.lua: `sbx cleanup CONFIG.lua [--force]` (spec/runtime.md 6.4).
-- Lists this installation's stale containers and, with --force, removes
-- them. Never touches a container without this installation's label, nor
-- one whose owner is a live host.
local args_mod = require "sandbox.cli._args"
local async = require "sandbox.async"
local container = require "sandbox.drivers._sealed"
local installation = require "sandbox.runtime._installation"
local options = require "sandbox.runtime._options"

local M = {}

M.help = [[usage: sbx cleanup CONFIG.lua [--force]

Finds this installation's sandbox containers (labelled with the installation
id of the config's runRoot and workspaceRoot) and prints one line each:
  <name> stale|in use removed|kept|failed
If no host holds the installation lock, every one is stale (and leftover
turn-XXXXXX run directories are removed with --force too). If a live host
holds it, only containers whose owner process is gone are stale; the live
host's containers and run directories are never touched.
Without --force nothing is removed. Exit status 0 when nothing failed.
]]

local function err(msg) io.stderr:write("sbx cleanup: ", msg, "\n") end

-- The runtime checks of 3.1 steps 1-14 without starting a runtime, on the
-- options the config's runtime would get (app:runtime_options; cleanup never
-- calls the model, so a login that returns nothing stands in for apiKey):
-- the resolved canonical roots and the driver.
local function resolve(cfg)
  return options.resolve(cfg:runtime_options { hostLogin = function() return nil end })
end

-- Runs inside a task. r = {runRoot, workspaceRoot (canonical), driver}, as
-- the runtime checks resolve them. Returns the exit status.
function M.cleanup(r, force, out)
  out = out or function(line) io.stdout:write(line, "\n") end
  local driver = r.driver
  if type(driver) ~= "table" or type(driver.list) ~= "function" or type(driver.remove) ~= "function" then
    err("the configured driver cannot list or remove containers")
    return 1
  end
  local lock, why = installation.try_lock(r.runRoot)
  if not lock and why ~= "busy" then
    err("cannot open the run root: " .. tostring(why))
    return 1
  end
  local mode = lock and "free" or "busy"
  local id = installation.id(r.workspaceRoot, r.runRoot)
  local status = 0
  local ok, list = pcall(driver.list, driver, id)
  if not ok then
    err(tostring(list))
    if lock then lock:release() end
    return 1
  end
  local any_kept = false
  for _, c in ipairs(installation.stale(list, { mode = mode })) do
    if not container.name_valid(c.name) then
      err("left alone: a labelled container with an unexpected name: " .. c.name)
    elseif not c.stale then
      out(c.name .. " in use kept")
    elseif not force then
      any_kept = true
      out(c.name .. " stale kept")
    elseif pcall(driver.remove, driver, c.name) then
      out(c.name .. " stale removed")
    else
      status = 1
      out(c.name .. " stale failed")
    end
  end
  if lock then
    if force then
      if not installation.remove_turn_dirs(r.runRoot, nil) then
        err("leftover turn directories could not be removed")
        status = 1
      end
    end
    lock:release()
  end
  if any_kept then out("rerun with --force to remove the stale containers") end
  return status
end

function M.run(argv)
  local parsed, perr = args_mod.parse(argv, { flags = { force = "bool" }, interleave = true })
  if not parsed then
    err(perr)
    return 2
  end
  if #parsed.positional ~= 1 then
    io.stderr:write(M.help)
    return 2
  end
  local cfg, cerr = args_mod.load_config(parsed.positional[1])
  if not cfg then
    err(cerr)
    return 1
  end
  local ok, status = pcall(async.run, function()
    return M.cleanup(resolve(cfg), parsed.flags.force == true)
  end)
  if not ok then
    err(tostring(status))
    return 1
  end
  return status
end

return M
