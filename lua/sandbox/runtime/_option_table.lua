-- runtime/_option_table.lua: the one declaration of the sealed mode's option
-- names (spec/runtime.md 2.1-2.2, providers.md 1, operations.md 2-4,
-- hardening.md, warm-turns.md 2). Pure data (no engine module), read by
-- sandbox{} (init.lua OPTIONS: `unknown sandbox option: <name>`),
-- sandbox.runtime{} (runtime/_options.lua OPTIONS), `sbx doctor` through
-- them, and scripts/gen_bun_options.lua, which generates the Bun bridge's
-- list of the options it sends as JSON (bun/src/options.generated.ts).
--
-- Each entry: {name, where, crossing}: where = "both", "sandbox" (sandbox{}
-- only) or "runtime" (sandbox.runtime{} only); crossing = "plain" (a JSON
-- value the Bun bridge sends as it is) or "host" (a host function or
-- object: the bridge's own option, or only in a Lua config).
local M = {}

M.TABLE = {
  { "image", "both", "plain" },
  { "runRoot", "both", "plain" },
  { "workspaceRoot", "both", "plain" },
  { "stateFile", "sandbox", "plain" },
  { "provider", "sandbox", "plain" },
  { "model", "both", "plain" },
  { "modelUrl", "both", "plain" },
  { "tools", "both", "plain" },            -- without run (a Lua config's)
  { "mcp", "both", "plain" },              -- without apiKey (a Lua config's)
  { "limits", "both", "plain" },
  { "turnTimeoutMs", "both", "plain" },
  { "initialChannels", "sandbox", "plain" },
  { "prompt", "both", "plain" },
  { "uid", "both", "plain" },
  { "gid", "both", "plain" },
  { "allowHttp", "both", "plain" },
  { "modelAuth", "both", "plain" },
  { "maxOutputTokens", "both", "plain" },
  { "outputTokensField", "both", "plain" },
  { "upstreamRetries", "both", "plain" },
  { "modelFallbacks", "both", "plain" },
  { "logFormat", "both", "plain" },
  { "logLevel", "both", "plain" },
  { "audit", "both", "plain" },
  { "seccompProfile", "both", "plain" },
  { "workspaceQuotaMb", "both", "plain" },
  { "diskReserveMb", "both", "plain" },
  { "maxQueuedTurns", "sandbox", "plain" },
  { "mentions", "both", "plain" },
  { "maxReplyChars", "both", "plain" },
  { "metricsListen", "both", "plain" },
  { "warm", "both", "plain" },
  { "runtime", "both", "plain" },
  { "timeZone", "runtime", "plain" },      -- sandbox{} takes the host's ($TZ)
  { "apiKey", "both", "host" },
  { "budget", "both", "host" },
  { "driver", "both", "host" },
  { "logger", "both", "host" },
}

M.SANDBOX, M.RUNTIME, M.SANDBOX_PLAIN = {}, {}, {}
for _, o in ipairs(M.TABLE) do
  local name, where = o[1], o[2]
  if where ~= "runtime" then M.SANDBOX[name] = true end
  if where ~= "sandbox" then M.RUNTIME[name] = true end
  if where ~= "runtime" and o[3] == "plain" then M.SANDBOX_PLAIN[#M.SANDBOX_PLAIN + 1] = name end
end

return M
