-- rich/_lifecycle.lua: a channel's container and broker across turns
-- (spec/rich-mode.md 6): start (one at a time per channel; a caller that finds
-- one pending waits for it), stop, startFresh, stopBrokers, status and the
-- two directory lookups, each after the alias guard. All yield: call them
-- from a task on the loop.
--
-- Per channel (rt.chans[key]): broker (rich/broker), profile it serves,
-- starting (the pending start's task and profile), active (the running
-- turn's {signal}), level (the effort judged last).
local async = require "sandbox.async"
local broker = require "sandbox.rich.broker"
local channel = require "sandbox.rich._channel"
local core = require "sandbox.core"
local errors = require "sandbox.errors"

local M = {}

M.READY_POLL_MS = 100
M.ARCHIVED = "Sandbox conversation archived"

local function fail(msg) error(msg, 0) end

function M.chan(rt, key)
  local c = rt.chans[key]
  if not c then
    c = {}
    rt.chans[key] = c
  end
  return c
end

-- The channel's paths after the alias guard.
function M.guarded(rt, key)
  local p = channel.paths(rt.o.partyDir, key)
  channel.guard(p, key)
  return p
end

function M.container_name(rt, p)
  return rt.o.containerPrefix .. "-" .. p.segment
end

local function spec_for(rt, key, profile, p)
  local o = rt.o
  return {
    name = M.container_name(rt, p), image = o.image, channel = key, profile = profile,
    timeZone = o.timeZone, labelChannel = o.labelChannel, labelProfile = o.labelProfile,
    runDir = p.run, workspaceDir = p.workspace, uid = o.uid, gid = o.gid,
  }
end

local function new_broker(rt, key, profile)
  local o, prof = rt.o, rt.o.profiles[profile]
  local servers = {}
  for i, name in ipairs(prof.mcp) do
    local s = o.mcp.by_name[name]
    if not s then fail(errors.RICH_MCP_MISSING .. name .. " unavailable") end
    servers[i] = s
  end
  return broker.new {
    model = prof.model, profile = profile, servers = servers, tools = o.tools, oauthToken = o.oauthToken,
    mcpToken = o.mcp.token, upstream = o.upstream, fetch = rt.fetch, maxCalls = o.maxCalls,
    maxOutputTokens = o.maxOutputTokens, upstreamRetries = o.upstreamRetries, turnTimeoutMs = o.turnTimeoutMs, workerImage = o.image,
    compaction = o.compaction, logger = rt.log, channel = key,
    clock = rt.clock, idleMs = rt.idle_ms, trace = rt.trace,
  }
end

-- One start, steps 1-7.
local function start_once(rt, key, profile, c)
  local o = rt.o
  if type(profile) ~= "string" or not o.profiles[profile] then fail(errors.RICH_PROFILE) end   -- 1
  local p = M.guarded(rt, key)
  channel.prepare(p)                                                                           -- 2, 3
  local name = M.container_name(rt, p)
  local st = rt.driver.status(name)                                                            -- 4
  local recreate = type(st) ~= "table" or st.state ~= "running"
    or (st.image ~= nil and st.image ~= o.image) or (st.profile ~= nil and st.profile ~= profile)
  if not c.broker or c.profile ~= profile or recreate then                                     -- 5
    if c.broker and recreate then rt.driver.remove(name) end
    if c.broker then c.broker:stop() end
    c.broker, c.profile = nil, nil
    local b = new_broker(rt, key, profile)
    core.fs_rmtree(p.socket)
    local ok, err = b:listen(p.socket)
    if not ok then fail(tostring(err)) end
    c.broker, c.profile = b, profile
  end
  rt.driver.ensureRunning(spec_for(rt, key, profile, p))                                       -- 6
  local b = c.broker
  local waited = 0                                                                              -- 7
  while not b.ready do
    if (c.active and c.active.signal.aborted) or c.cancelling or c.broker ~= b then fail(errors.RICH_CANCELLED) end
    if waited >= o.startTimeoutMs then fail(errors.RICH_NOT_READY) end
    async.sleep(M.READY_POLL_MS)
    waited = waited + M.READY_POLL_MS
  end
end

function M.start(rt, key, profile)
  local c = M.chan(rt, key)
  while c.starting do
    local pending = c.starting
    local ok = async.wait(pending.task)
    if ok and pending.profile == profile and c.broker and c.profile == profile then return end
    if c.starting == pending then c.starting = nil end
  end
  local task = async.spawn(start_once, rt, key, profile, c)
  local mine = { task = task, profile = profile }
  c.starting = mine
  local ok, err = async.wait(task)
  if c.starting == mine then c.starting = nil end
  if not ok then error(err, 0) end
end

-- Waits for the channel's pending start, ignoring its error. A start still
-- waiting for the worker's ready gives up at once (errors.RICH_CANCELLED).
function M.settle_start(c)
  c.cancelling = true
  while c.starting do
    local pending = c.starting
    async.wait(pending.task)
    if c.starting == pending then c.starting = nil end
  end
  c.cancelling = nil
end

function M.stop(rt, key)
  local c = M.chan(rt, key)
  if c.active then c.active.signal:abort("stopped") end
  M.settle_start(c)
  local p = M.guarded(rt, key)
  rt.driver.remove(M.container_name(rt, p))
  if c.broker then c.broker:stop() end
  c.broker, c.profile, c.level = nil, nil, nil
end

function M.start_fresh(rt, key)
  M.stop(rt, key)
  local p = M.guarded(rt, key)
  local archived = channel.archive_sessions(p)
  channel.own_directory(p.attachments)
  rt.log.info(M.ARCHIVED, { channel = key, archived = archived })
  return archived
end

function M.stop_brokers(rt)
  for _, c in pairs(rt.chans) do
    if c.active then c.active.signal:abort("host stopping") end
  end
  for _, c in pairs(rt.chans) do M.settle_start(c) end
  for _, c in pairs(rt.chans) do
    if c.broker then c.broker:stop() end
  end
  rt.chans = {}
end

function M.status(rt, key)
  local p = M.guarded(rt, key)
  return rt.driver.status(M.container_name(rt, p))
end

function M.sessions_dir(rt, key) return M.guarded(rt, key).sessions end
function M.attachment_dir(rt, key) return M.guarded(rt, key).attachments end

return M
