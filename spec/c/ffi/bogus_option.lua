-- bogus_option.lua: a config whose sandbox{} call fails (spec/c/ffi/ffi_test.c
-- checks that sbx_engine_new hands the Lua error message back).
return require("sandbox") {
  image = "pi-roundtable-sandbox:local",
  runRoot = "/tmp/none-run", workspaceRoot = "/tmp/none-ws", stateFile = "/tmp/none-state/channels.json",
  model = "m", modelUrl = "https://models.example/v1/chat/completions",
  bogus = true,
}
