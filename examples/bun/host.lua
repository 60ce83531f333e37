-- examples/bun/host.lua: the trusted host Lua config behind the Bun examples
-- (roundtable.config.ts, guest-bot.ts). The TypeScript side passes the
-- JSON options (image, roots, model, modelUrl, ...) and the apiKey function;
-- this script adds what only Lua can define: host tools, which run as
-- coroutines on the engine's loop, never in the chat bot's JS thread.
--
-- The engine calls this script with the decoded options_json: `opts.sandbox`
-- holds the options roundtable.config.ts gave, which the engine merges over
-- what this script returns anyway; they are merged here too so that
-- sandbox{} sees a complete option set on its first check.
local sandbox = require "sandbox"

local opts = ...
local o = {}
for k, v in pairs(type(opts) == "table" and opts.sandbox or {}) do o[k] = v end

-- One host tool. Every guest of every sandbox channel may call it, so offer
-- only what you mean every guest to have; the worker names it host_clock and
-- the broker accepts only POST /tools/clock.
o.tools = {{
  name = "clock",
  description = "Read the current UTC time",
  parameters = { type = "object", properties = {}, additionalProperties = false },
  -- input: the guest's JSON object (untrusted). ctx.channel and ctx.speaker
  -- come from the bound turn, never from input.
  run = function(_input, ctx)
    ctx.signal:throw_if_aborted()
    return os.date("!%Y-%m-%dT%H:%M:%SZ")
  end,
}}

-- guest-bot.ts --offline: a stand-in for Docker that answers without a
-- container (the claim, commands, channel queue and state are still real).
if os.getenv("SANDBOX_EXAMPLE_OFFLINE") == "1" then
  o.driver = {
    run = function(_, _spec, turn)
      return { ok = true, text = turn.speaker.name .. ", (offline, no container) you said: " .. turn.text }
    end,
  }
end

return sandbox(o)
