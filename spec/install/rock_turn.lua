-- rock_turn.lua: plain lua5.4 (not sbx, not busted) over the modules that
-- `luarocks make` installed into a temporary tree (spec/install/
-- install_test.sh sets LUA_PATH/LUA_CPATH to that tree only): require
-- "sandbox", then one real sealed turn through sandbox.runtime against the
-- scripted model of `sbx demo` on loopback.
--   lua5.4 rock_turn.lua ROOT IMAGE
-- Prints "core <path of sandbox.core> <core.version>" and "reply <text>";
-- exits 0 when the turn succeeded and its reply quotes the saved note.
local sandbox = require "sandbox"
local async = require "sandbox.async"
local core = require "sandbox.core"
local demo_model = require "sandbox.cli._demo_model"
local runtime = require "sandbox.runtime"

local root, image = arg[1], arg[2] or "pi-roundtable-sandbox:local"
assert(root and root:sub(1, 1) == "/", "usage: lua5.4 rock_turn.lua ROOT [IMAGE]")
assert(type(sandbox) == "table" or type(sandbox) == "function", "require 'sandbox' returned nothing")
print("core " .. tostring(package.searchpath("sandbox.core", package.cpath)) .. " " .. core.version)

local ok, res = pcall(async.run, function()
  local key = "rock-spec-key-" .. core.random_hex(16)
  local model = assert(demo_model.start { key = key, model = "demo-model" })
  local rt
  local good, out = pcall(function()
    rt = runtime.new {
      image = image, runRoot = root .. "/run", workspaceRoot = root .. "/ws",
      model = "demo-model", modelUrl = model.url, allowHttp = true,
      apiKey = function(_scope) return key end,
    }
    return rt:run_turn("install:rock", { id = "u1", name = "Ada", principalId = "p1" },
      "Please remember that the rock turn works.")
  end)
  if rt then rt:dispose() end
  model:close()
  if not good then error(out, 0) end
  return out
end)
if not ok then
  io.stderr:write("rock_turn: ", tostring(res), "\n")
  os.exit(1)
end
print("reply " .. tostring(res.text))
os.exit(res.ok == true and tostring(res.text):find("the rock turn works", 1, true) ~= nil and 0 or 1)
