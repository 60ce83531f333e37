-- init.lua: `local sandbox = require "sandbox"`. A config script returns
-- `sandbox { ... }` with the option names of spec/runtime.md section 2.2.
-- This module checks the option names and everything the broker uses, and
-- hands out brokers bound to one turn. (The container runtime, channel state
-- and claim build on the same options.) The value `sandbox{}` returns is the
-- unstarted app of lua/sandbox/app.lua: still a config for the CLI, and what
-- an embedding host starts with `app:start(host)` (see app.lua's header).
local app = require "sandbox.app"
local broker = require "sandbox.broker"
local broker_config = require "sandbox.broker._config"
local errors = require "sandbox.errors"
local log = require "sandbox.log"
local metrics_listen = require "sandbox.ops.metrics_listen"
local options = require "sandbox.runtime._options"
local turn_queue = require "sandbox.channels._queue"

local M = {}

-- The option names of sandbox{}: the sealed mode's one declaration
-- (runtime/_option_table.lua), which sandbox.runtime{} and the Bun bridge's
-- generated list read too.
M.OPTIONS = require("sandbox.runtime._option_table").SANDBOX

M.DEFAULT_TURN_TIMEOUT_MS = options.DEFAULT_TURN_TIMEOUT_MS

local Config = {}
Config.__index = Config

local function fail(msg) error(msg, 0) end

-- Validates opts and returns the app (lua/sandbox/app.lua): a config object
-- (`options`, `broker`) that `app:start(host)` turns into the running
-- sandbox. Raises the spec's error string. The broker configuration checked
-- here is the one the runtime and every broker use (no second check).
function M.new(opts)
  if type(opts) ~= "table" then fail(errors.OPTIONS_TABLE) end
  broker_config.check_option_names(opts, M.OPTIONS)
  options.check_model(opts.model)
  if opts.apiKey ~= nil and type(opts.apiKey) ~= "function" then fail(errors.API_KEY_TYPE) end
  if opts.budget ~= nil and type(opts.budget) ~= "function" then fail(errors.BUDGET_TYPE) end
  options.check_prompt(opts.prompt)
  local timeout = options.check_turn_timeout(opts.turnTimeoutMs)
  log.check_options(opts)
  options.check_hardening(opts)
  options.check_runtime(opts.runtime)
  local max_queued = turn_queue.check_max(opts.maxQueuedTurns)
  metrics_listen.check(opts.metricsListen)
  options.check_warm(opts.warm)
  -- The throw-away broker check of spec/runtime.md 3.1 step 14: no socket.
  local cfg = broker_config.check(opts)
  options.check_api_key_use(opts.apiKey, cfg)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.turnTimeoutMs = timeout
  o.maxQueuedTurns = max_queued
  o.provider = o.provider or "openai"
  return app.wrap({ options = o, broker_config = cfg }, Config)
end

-- A broker bound to one turn: t = {channel=, speaker={id,name,principalId},
-- signal=, recorder=, turnId=} (recorder: sandbox/ops/record.lua, whose
-- readers get every call record).
function Config:broker(t)
  local o = self.options
  if type(o.apiKey) ~= "function" and self.broker_config.modelAuth ~= "none" then
    fail(errors.API_KEY_REQUIRED)
  end
  return broker.bind(self.broker_config, {
    apiKey = o.apiKey, budget = o.budget, channel = t.channel, speaker = t.speaker, signal = t.signal,
    recorder = t.recorder, turnId = t.turnId,
  })
end

function M.is_config(v)
  return getmetatable(v) == Config or app.is_app(v)
end

M.broker = broker.new

-- `sandbox.runtime{...}`: the sealed runtime alone (spec/runtime.md 2.1, 3.1).
M.runtime = require "sandbox.runtime"
-- Scoped delegation and diagnostics for host tools (fetch-and-delegation.md 2-3).
M.delegator = require "sandbox.delegator"
M.scoped_delegator = M.delegator.new
M.research_worker = require("sandbox.delegator.research").new
M.scrub_diagnostic = require("sandbox.delegator.scrub").scrub_diagnostic
-- Rich (Pi/subscription) mode, opted into separately (rich-mode.md).
M.rich = require "sandbox.rich"
-- Safe fetch of model-supplied URLs (fetch-and-delegation.md 1).
M.fetch = require "sandbox.fetch"
M.safe_fetch = M.fetch.safe_fetch
M.assert_public_url = M.fetch.assert_public_url
-- The precheck script runner (precheck.md): agent-written JavaScript
-- prechecks in a sealed container with granted MCP tools only.
M.precheck = require "sandbox.precheck"
M.precheckScriptRunner = M.precheck.new
M.PRECHECK_ENTRYPOINT = M.precheck.PRECHECK_ENTRYPOINT

return setmetatable(M, { __call = function(_, opts) return M.new(opts) end })
