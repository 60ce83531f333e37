-- rich/init.lua: `sandbox.rich(options)`, the explicit Pi/subscription mode
-- (spec/rich-mode.md). One long-lived, sealed container per channel runs a
-- real Pi session; its broker (rich/broker) carries the Anthropic Messages
-- API with streaming, host tools and MCP under the host's caps. The sealed
-- `sandbox{}` and its defaults are untouched. Every method yields: call them
-- from a task on the loop (async.spawn / async.run).
--
--   local rich = require "sandbox.rich"         (also require("sandbox").rich)
--   local rt = rich { partyDir = ..., image = ..., profiles = {...}, oauthToken = ...,
--                     effort = { judge = ... }, driver = rich.dockerDriver { ... } }
--   rt:start(channel, profile)   rt:stop(channel)   rt:startFresh(channel)
--   rt:status(channel)           rt:sessionsDir(channel)   rt:attachmentDir(channel)
--   rt:stopBrokers()             rt:runTurn{channel, profile, turnId, author, text, images, signal?}
--   rt:metrics()                 the Prometheus text (sbx_turns_total{mode="rich",...})
--   rich.broker(options)         a channel's broker alone (PiSandboxBroker)
--   rich.transport{...}          the built-in upstream transport, fetchImpl-shaped
--   rich.collectAttachments(message, dir, opts)   16.4 (rich/_attachments.lua)
--
-- The host rules of 14.1 live in rich/broker/_privacy.lua; the worker's
-- half of 14.2, 15.1-15.2 and 16.5 is worker/pi/.
local broker = require "sandbox.rich.broker"
local core = require "sandbox.core"
local docker = require "sandbox.rich.docker"
local lifecycle = require "sandbox.rich._lifecycle"
local log = require "sandbox.rich._log"
local metrics = require "sandbox.ops.metrics"
local options = require "sandbox.rich._options"
local text = require "sandbox.rich._text"
local transport = require "sandbox.rich._transport"
local turn = require "sandbox.rich._turn"

local M = {}

local Runtime = {}
Runtime.__index = Runtime

-- options: section 3, plus the operator log's options of spec/operations.md
-- 2-3 (logFormat, logLevel, audit). `seams` (specs and benches only): {host
-- = {uid, gid, linux}, clock = {now, timer}, idleMs, trace}.
function M.new(opts, seams)
  seams = seams or {}
  local o = options.resolve(opts, seams.host)
  local rt = setmetatable({
    o = o, chans = {}, log = log.new(o.logger, o.log), clock = seams.clock or broker.DEFAULT_CLOCK,
    idle_ms = seams.idleMs, trace = seams.trace,
  }, Runtime)
  -- one record per turn and per broker call (ops/record.lua), read by the
  -- operator log and by the one metrics registry type (ops/metrics.lua):
  -- sbx_turns_total{mode="rich",reason=...}, the broker families
  rt.recorder = rt.log.recorder
  rt.metrics_registry = metrics.new { mode = "rich" }
  rt.recorder:subscribe(rt.metrics_registry:reader())
  -- sbx_containers{state="running"}: the channels whose long-lived container
  -- has a broker in this process (started and not stopped)
  rt.metrics_registry:containers_source(function()
    local n = 0
    for _, c in pairs(rt.chans) do if c.broker then n = n + 1 end end
    return { running = n }
  end)
  -- a driver of the contract (sandbox.drivers.cli{} / .engine{}) runs the
  -- long-lived lifecycle as the built-in one does (rich/docker.lua)
  rt.driver = o.driver and docker.adapt(o.driver, o.labelProfile) or docker.new { labelProfile = o.labelProfile }
  rt.fetch = transport.new(o.fetchImpl)
  return rt
end

function Runtime:start(channel, profile) return lifecycle.start(self, channel, profile) end
function Runtime:stop(channel) return lifecycle.stop(self, channel) end
function Runtime:startFresh(channel) return lifecycle.start_fresh(self, channel) end
function Runtime:stopBrokers() return lifecycle.stop_brokers(self) end
function Runtime:status(channel) return lifecycle.status(self, channel) end
function Runtime:sessionsDir(channel) return lifecycle.sessions_dir(self, channel) end
function Runtime:attachmentDir(channel) return lifecycle.attachment_dir(self, channel) end
function Runtime:runTurn(t) return turn.run(self, t) end
-- The Prometheus exposition of this runtime's turns and broker calls
-- (spec/operations.md 4; PiSandboxRuntime.metrics() in Bun).
function Runtime:metrics() return self.metrics_registry:render() end

-- The channel's broker in this process (specs and diagnostics), or nil.
function Runtime:broker(channel)
  local c = self.chans[channel]
  return c and c.broker or nil
end

function M.is_runtime(v) return getmetatable(v) == Runtime end

-- A broker alone (a host that runs its own container lifecycle): the
-- broker options of section 3 plus model and servers (names from mcp.servers,
-- all of them when absent); workerImage names the image in capability errors.
function M.broker(opts, seams)
  seams = seams or {}
  local o = options.resolve_broker(opts)
  return broker.new {
    model = o.model, servers = o.servers, tools = o.tools, oauthToken = o.oauthToken, mcpToken = o.mcpToken,
    upstream = o.upstream, fetch = transport.new(o.fetchImpl), maxCalls = o.maxCalls,
    maxOutputTokens = o.maxOutputTokens, upstreamRetries = o.upstreamRetries, turnTimeoutMs = o.turnTimeoutMs,
    workerImage = o.workerImage,
    compaction = o.compaction, logger = log.new(o.logger, o.log),
    clock = seams.clock, idleMs = seams.idleMs, headerTimeoutMs = seams.headerTimeoutMs, trace = seams.trace,
  }
end

M.dockerDriver = docker.new
M.collectAttachments = require("sandbox.rich._attachments").collect
M.transport = transport.curl
M.channelSegment = require("sandbox.rich._channel").segment
M.errorText = text.error_text
M.scrubDiagnostic = core.scrub_diagnostic

return setmetatable(M, { __call = function(_, opts, seams) return M.new(opts, seams) end })
