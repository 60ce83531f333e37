-- drivers/init.lua: the built-in container drivers (spec/runtime.md 4.1).
--   require("sandbox.drivers").cli{binary="docker"}   the default
--   require("sandbox.drivers").engine{}               the Engine API over the
--                                                     daemon's Unix socket
local M = {}

M.cli = require "sandbox.drivers.cli"
M.engine = require "sandbox.drivers.engine"

return M
