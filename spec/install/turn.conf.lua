-- turn.conf.lua: the config of the installed-tree specs' real turns
-- (spec/install/install_test.sh: the C host turn.c through the ABI, and the
-- Bun package after `bun add`). It starts the scripted model of `sbx demo`
-- (sandbox.cli._demo_model) on the engine's own loop, on loopback, answering
-- only the per-run host key, and returns the real app over the default
-- docker CLI driver, so a turn is a real sealed container. The embedding
-- passes its decoded options_json as the chunk's argument; `root` is the
-- caller's private temporary folder, `image` the worker image.
local core = require "sandbox.core"
local demo_model = require "sandbox.cli._demo_model"

local opts = ...
local root = assert(type(opts) == "table" and opts.root, "options_json.root is required")
local key = "install-spec-key-" .. core.random_hex(16)
local model = assert(demo_model.start { key = key, model = "demo-model" })

return require("sandbox") {
  image = opts.image or "pi-roundtable-sandbox:local",
  runRoot = root .. "/run", workspaceRoot = root .. "/ws", stateFile = root .. "/state/channels.json",
  model = "demo-model", modelUrl = model.url, allowHttp = true,
  apiKey = function(_scope) return key end,
}, function() model:close() end
