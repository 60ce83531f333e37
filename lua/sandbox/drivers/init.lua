-- drivers/init.lua: the built-in container drivers (spec/runtime.md 4.1).
--   require("sandbox.drivers").cli{binary="docker"}   the default
local M = {}

M.cli = require "sandbox.drivers.cli"

return M
