-- precheck/init.lua: `sandbox.precheckScriptRunner(options)`, the precheck
-- script runner (shared/spec/precheck.md). A schedule's precheck is a short
-- JavaScript module an agent wrote; before the scheduled turn the runner
-- executes it in a fresh sealed container (one per run, image
-- pi-roundtable-sandbox:precheck) whose only way out is a per-run broker that
-- forwards single MCP `tools/call` requests to the tools the host granted for
-- that schedule's channel, target and tier and that were approved with the
-- script. The chat bot's core keeps and parses scripts; this runner runs them.
--
--   local runner = sandbox.precheckScriptRunner {
--     image = "pi-roundtable-sandbox:precheck",
--     runRoot = "/var/lib/roundtable-sandbox/precheck",     -- at most 72 bytes, 0700
--     grant = function(scope)          -- scope = {channel, target, tier}; may yield
--       if scope.tier ~= "owner" then return {} end
--       return {{ name = "health", url = "https://mcp.example/health",
--                 tools = { "garmin-login", "garmin-get-hrv" },
--                 token = function(scope, ctx) return os.getenv("HEALTH_TOKEN") end }}
--     end,
--   }
--   runner.describe(scope)          -> guide text for the model (in a task)
--   runner.run(script, context)     -> the script's result (in a task; raises)
--   runner.toolName(server, tool)   -> the name the host's hold rules know
--   runner.timeoutMs                -> present only when the option was set
--   runner.metrics()                -> the runs' Prometheus exposition
--                                      (sbx_turns_total{mode="precheck",...})
--
-- The members are plain functions (runner.run(...) and runner:run(...) both
-- work). describe and run yield: call them from a task (sandbox.async) or
-- through the Bun bridge, which turns them into promises.
--
-- Layout: _options (2, 2.1), _grant (2.2, 4 step 3), _describe (3), _run (4),
-- _broker (5), _message (5.2, 5.3), _docker (6.1 through the CLI driver).
local describe = require "sandbox.precheck._describe"
local errors = require "sandbox.errors"
local grants = require "sandbox.precheck._grant"
local options = require "sandbox.precheck._options"
local run = require "sandbox.precheck._run"

local M = {}

M.PRECHECK_ENTRYPOINT = options.ENTRYPOINT
M.IMAGE = "pi-roundtable-sandbox:precheck"
M.E_TOOL_NAME_RESULT = errors.PRECHECK_TOOL_NAME_RESULT
M.E_TOOL_NAME_YIELD = errors.PRECHECK_TOOL_NAME_YIELD

-- The container arguments of one precheck spec (shared/spec/precheck.md
-- 6.1), for operators and specs: `docker` + these runs exactly one run.
M.container_args = function(spec) return require("sandbox.drivers._sealed").args(spec) end
M.container_spec = options.container_spec

-- Lets `runner.f(...)` and `runner:f(...)` both work.
local function member(runner, fn)
  return function(first, ...)
    if first == runner then return fn(...) end
    return fn(first, ...)
  end
end

local function copy_scope(scope)
  if type(scope) ~= "table" then return grants.scope(nil, nil, nil) end
  return grants.scope(scope.channel, scope.target, scope.tier)
end

-- The resolved options of each runner this process made (weak keys), for
-- `sbx doctor` (M.facts) and the metrics (M.metrics).
local FACTS = setmetatable({}, { __mode = "k" })

-- runner -> {image, runRoot, uid, gid, maxCalls, timeoutMs} | nil (not a runner)
function M.facts(runner)
  local o = FACTS[runner]
  if not o then return nil end
  return { image = o.image, runRoot = o.runRoot, uid = o.uid, gid = o.gid, maxCalls = o.maxCalls,
    timeoutMs = o.timeoutMs, driver = o.driver }
end

function M.new(opts)
  local o = options.resolve(opts)
  local runner = {}
  FACTS[runner] = o
  runner.describe = member(runner, function(scope)
    return describe.text(grants.call(o.grant, copy_scope(scope), o.allowHttpMcp))
  end)
  runner.run = member(runner, function(script, context)
    return run.run(o, script, context)
  end)
  runner.toolName = member(runner, function(server, tool)
    if o.toolName == nil then return tool end
    local co = coroutine.create(o.toolName)
    local ok, name = coroutine.resume(co, server, tool)
    if not ok then error(name, 0) end
    if coroutine.status(co) ~= "dead" then error(M.E_TOOL_NAME_YIELD, 0) end
    if type(name) ~= "string" or name == "" then error(M.E_TOOL_NAME_RESULT, 0) end
    return name
  end)
  runner.timeoutMs = o.timeoutMs
  runner.metrics = member(runner, function() return o.metrics:render() end)
  return runner
end

return setmetatable(M, { __call = function(_, opts) return M.new(opts) end })
