-- examples/precheck.conf.lua: a precheck script runner (shared/spec/
-- precheck.md) for a trusted plugin to hand to the chat bot's precheck
-- service. A schedule's precheck script may call only what grant() returns
-- for its channel, target and tier, and only the calls approved when the
-- script was saved; the server URL and its token stay on the host.
--
-- The Bun bridge loads it (examples/bun/precheck.ts):
--   const runner = precheckScriptRunner({ config: "examples/precheck.conf.lua",
--     options: { runRoot, healthUrl } });
--   PRECHECKS.useScriptRunner(runner);
-- `options` (JSON from the plugin) is this script's argument; without it the
-- script reads HEALTH_MCP_URL / HEALTH_MCP_TOKEN from the environment.
--
-- Give lower tiers narrower grants: a script never needs more than the
-- schedule's own agent may call. An empty grant means the script reaches
-- nothing outside its container. grant and token may yield (they run on the
-- engine's loop); toolName must answer at once.
local sandbox = require "sandbox"

local opts = ... or {}
local health_url = opts.healthUrl or os.getenv("HEALTH_MCP_URL") or "https://mcp.example.com/health"

return sandbox.precheckScriptRunner {
  image = "pi-roundtable-sandbox:precheck",            -- built by `make image`
  runRoot = opts.runRoot or "/tmp/roundtable-precheck", -- at most 72 bytes; created 0700
  allowHttpMcp = opts.allowHttpMcp == true,            -- only for a same-host loopback server
  timeoutMs = 30000,                                    -- the runner's own backstop
  maxCalls = 8,
  grant = function(scope)
    -- scope = {channel=..., target=..., tier=...}: the run's tier, never the
    -- tier the schedule was created with
    if scope.tier ~= "owner" and scope.tier ~= "member" then return {} end
    local tools = { "garmin-login", "garmin-get-hrv" }
    return {
      {
        name = "health",
        url = health_url,                                -- used verbatim; https in production
        tools = tools,
        token = function(_, ctx)                         -- read on the host for each call
          ctx.signal:throw_if_aborted()
          return opts.healthToken or os.getenv("HEALTH_MCP_TOKEN") or ""
        end,
      },
    }
  end,
  -- The host's agent knows MCP tools as <server>_<tool>; its hold rules too.
  toolName = function(server, tool) return server .. "_" .. tool end,
}
