-- examples/sandbox.conf.lua: the product's documented configuration, for
-- `sbx run`, `sbx chat`, `sbx doctor` and `sbx cleanup`:
--
--   export MODEL_API_KEY=...            # the default key
--   export TEAM_A_API_KEY=...           # optional: a key of its own for one channel
--   sbx doctor examples/sandbox.conf.lua
--   sbx run examples/sandbox.conf.lua --channel demo:one --speaker alice:Alice "What time is it?"
--   sbx chat examples/sandbox.conf.lua --channel demo:one --speaker alice:Alice
--
-- Keys stay in the host's environment: apiKey runs on the host before every
-- model call, the broker puts its answer into the Authorization header, and
-- the container only ever holds the dummy key. Keep secrets in the service's
-- protected environment, never in this file or the image.
local sandbox = require "sandbox"

local home = os.getenv("HOME")
if not home or home == "" then error("HOME is required", 0) end

-- One host tool. Every guest of every sandbox channel may call it, so offer
-- only what you mean every guest to have; the worker names it host_clock.
local clock = {
  name = "clock",
  description = "Read the current UTC time",
  parameters = { type = "object", properties = {}, additionalProperties = false },
  -- input is the guest's JSON object (untrusted data); ctx.channel and
  -- ctx.speaker come from the bound turn, never from input.
  run = function(_input, ctx)
    ctx.signal:throw_if_aborted()
    return os.date("!%Y-%m-%dT%H:%M:%SZ")     -- ISO 8601, UTC
  end,
}

-- Per-channel keys: a channel listed here uses its own key; the others use
-- MODEL_API_KEY. A nil or "" answer fails that model call closed (the broker
-- answers 502); there is never a fallback to another credential.
local keys = {
  ["discord:team-a"] = os.getenv("TEAM_A_API_KEY"),
}

return sandbox {
  image = "pi-roundtable-sandbox:local",
  runRoot = "/tmp/roundtable-sandbox-run",
  workspaceRoot = home .. "/.local/share/roundtable-sandbox/workspaces",
  stateFile = home .. "/.local/share/roundtable-sandbox/state/channels.json",
  provider = "openai",
  model = "operator-selected-model",
  modelUrl = "https://api.openai.com/v1/chat/completions",
  -- scope = {channel=..., speaker={id=..., name=..., principalId=...}}
  apiKey = function(scope)
    local key = keys[scope.channel]
    if key ~= nil then return key end
    return os.getenv("MODEL_API_KEY")
  end,
  tools = { clock },
}
