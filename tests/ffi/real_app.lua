-- real_app.lua: the real app (sandbox{...}) over a Lua fake driver (no
-- Docker), for tests/ffi/ffi_test.c. The embedding passes its decoded
-- options_json as the chunk's argument; `root` is the test's temp folder.
local opts = ...
local root = assert(opts.root, "options_json.root is required")

local driver = {}
function driver:run(_, turn)
  return { ok = true, text = "fake: " .. turn.text }
end

return require("sandbox") {
  image = "pi-roundtable-sandbox:local",
  runRoot = root .. "/run", workspaceRoot = root .. "/ws", stateFile = root .. "/state/channels.json",
  model = "spec-model", modelUrl = "https://models.example/v1/chat/completions",
  driver = driver,
}
