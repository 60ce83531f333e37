-- driver_layers_spec.lua: the drivers sit below the runtime (shared/review/
-- one-engine.md, "The shape to reach" 4): no module under lua/sandbox/drivers
-- requires sandbox.runtime, neither in its text nor through anything it
-- loads, so the drivers <-> runtime circle cannot come back. The runtime,
-- rich mode and precheck read the drivers; the drivers read none of them.
local spec_fs = require "spec_fs"

local UPPER = { "sandbox.runtime", "sandbox.rich", "sandbox.precheck", "sandbox.app", "sandbox.cli" }

local function driver_files()
  local out = {}
  for line in spec_fs.sh("ls lua/sandbox/drivers/*.lua"):gmatch("[^\n]+") do out[#out + 1] = line end
  return out
end

local function module_of(file)
  local m = file:gsub("^lua/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
  return m
end

-- Every module name a file's text requires (require "x", require("x"), require 'x').
local function required_in(text)
  local out = {}
  for name in text:gmatch("require%s*%(?%s*[\"']([%w_.]+)[\"']") do out[#out + 1] = name end
  return out
end

local function upper(name)
  for _, p in ipairs(UPPER) do
    if name == p or name:sub(1, #p + 1) == p .. "." then return true end
  end
  return false
end

describe("the driver layer", function()
  it("has modules to check (the scan sees lua/sandbox/drivers)", function()
    local files = driver_files()
    assert.is_true(#files >= 5, table.concat(files, " "))
  end)

  it("no module under lua/sandbox/drivers names sandbox.runtime, rich, precheck, app or cli in a require", function()
    local bad = {}
    for _, f in ipairs(driver_files()) do
      for _, name in ipairs(required_in(assert(spec_fs.read(f)))) do
        if upper(name) then bad[#bad + 1] = f .. " -> " .. name end
      end
    end
    assert.are.same({}, bad)
  end)

  it("the text scan finds a require of sandbox.runtime in any of its three spellings", function()
    assert.are.same({ "sandbox.runtime.container", "sandbox.runtime._seccomp", "sandbox.runtime" },
      required_in('local a = require "sandbox.runtime.container"\nlocal b = require("sandbox.runtime._seccomp")\n'
        .. "local c = require 'sandbox.runtime'\n"))
  end)

  it("loading every driver module, in a fresh Lua, loads nothing of the runtime or the modes above it", function()
    local lua = spec_fs.sh("command -v lua5.4 || command -v lua"):gsub("%s+$", "")
    assert.is_true(lua ~= "", "a lua interpreter is required")
    local mods = {}
    for _, f in ipairs(driver_files()) do mods[#mods + 1] = string.format("%q", module_of(f)) end
    local script = spec_fs.tmpdir("drv-layer")
    spec_fs.write(script .. "/probe.lua", [[
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "build/lua/?.so;" .. package.cpath
for _, m in ipairs { ]] .. table.concat(mods, ", ") .. [[ } do require(m) end
local seen = {}
for name in pairs(package.loaded) do
  if name:find("^sandbox%.") then seen[#seen + 1] = name end
end
table.sort(seen)
print(table.concat(seen, "\n"))
]])
    local out, code = spec_fs.run(spec_fs.q(lua) .. " " .. spec_fs.q(script .. "/probe.lua") .. " 2>&1")
    spec_fs.rmdir(script, "drv-layer")
    assert.are.equal(0, code, out)
    local loaded, bad = {}, {}
    for name in out:gmatch("[^\n]+") do
      loaded[name] = true
      if upper(name) then bad[#bad + 1] = name end
    end
    assert.is_true(loaded["sandbox.drivers.contract"] == true, out)
    assert.are.same({}, bad)
  end)

  it("the sealed container has one module, the drivers' (no alias beside it)", function()
    assert.is_nil(package.searchpath("sandbox.runtime.container", package.path))
  end)
end)
