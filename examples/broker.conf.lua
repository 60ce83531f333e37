-- examples/broker.conf.lua: a config script with one host tool, for
-- `sbx broker` (and, once the runtime lands, `sbx run`).
--   OPENAI_API_KEY=... sbx broker examples/broker.conf.lua \
--     --socket /tmp/sbx-demo/broker.sock --channel demo:one --speaker alice:Alice
-- The key stays in the host's environment: the config reads it on every call,
-- so the worker never sees it.
local sandbox = require "sandbox"

local clock = {
  name = "clock",
  description = "Current UTC date and time.",
  parameters = { type = "object", properties = {} },
  -- input: the guest's JSON object (untrusted); ctx.channel and ctx.speaker come
  -- from the bound turn, never from input. Return a string.
  run = function(input, ctx)
    ctx.signal:throw_if_aborted()
    return os.date("!%Y-%m-%dT%H:%M:%SZ")
  end,
}

return sandbox {
  image = "pi-roundtable-sandbox:local",
  runRoot = "/var/lib/roundtable-sandbox/run",
  workspaceRoot = "/var/lib/roundtable-sandbox/work",
  stateFile = "/var/lib/roundtable-sandbox/state/channels.json",
  model = "gpt-4o-mini",
  modelUrl = "https://api.openai.com/v1/chat/completions",
  apiKey = function(scope)
    -- scope = {channel=..., speaker={id, name, principalId}}: pick a key per
    -- channel here if you like. nil or "" fails the call closed.
    return os.getenv("OPENAI_API_KEY")
  end,
  tools = { clock },
}
