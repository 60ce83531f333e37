-- embed/_rich.lua: rich mode (lua/sandbox/rich) for an embedding host: the
-- Bun bridge's PiSandboxRuntime. The runtime lives in the engine; its
-- callbacks are the host's JavaScript functions, reached as host calls
-- (embed/init.lua Engine:host_call) of the owner the host registered.
-- Registered by embed/_utilities.lua; served by an engine without an app.
--
--   {"type":"rich.new","owner":O,"options":{...},"callbacks":{"oauthToken":true,...}}
--       options: the JSON-safe options of section 3 (partyDir, image,
--       profiles, upstream, mcp.servers, timeZone, ..., docker = {socket,
--       log}); callbacks names the host functions that exist: oauthToken,
--       effort.judge, memory.promptBlock, tools.call, mcp.token, fetchImpl,
--       logger, driver.ensureRunning|status|remove|logs, docker.log,
--       compaction.compact -> true
--   {"type":"rich.new","owner":O,"config":PATH,"options":{...}}
--       or: the trusted Lua config script at PATH, run with `options` as its
--       argument, returns the runtime (`return sandbox.rich { ... }`), its
--       callbacks Lua functions
--   {"type":"rich.runTurn","owner":O,"turn":{channel, profile, turnId, author, text, images}}
--       -> {ok, text, files:[{name, dataBase64}]} | {ok:false, error, cause};
--       the request's cancel aborts the turn's signal
--   {"type":"rich.start"|"rich.stop"|"rich.startFresh"|"rich.status"|
--    "rich.sessionsDir"|"rich.attachmentDir","owner":O,"channel":C[,"profile":P]}
--   {"type":"rich.stopBrokers"|"rich.dispose","owner":O}
--   {"type":"rich.metrics","owner":O} -> the runtime's Prometheus exposition text
-- Bytes cross JSON as base64: fetchImpl answers {status, headers,
-- bodyBase64}; reply files come back as dataBase64.
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local M = {}

-- The plain (JSON) options, from the one declaration (rich/_option_table.lua).
local OPTIONS = require("sandbox.rich._option_table").PLAIN

local function runtimes(self)
  self.riches = self.riches or {}
  return self.riches
end

-- Wall-clock milliseconds of a core.now() deadline, for JavaScript.
local function epoch_ms(deadline)
  if type(deadline) ~= "number" then return nil end
  return os.time() * 1000 + (deadline - core.now())
end

local function build_options(self, owner, o, cb)
  local call = function(fn, args, sig) return self:host_call(owner, fn, args, sig) end
  local opts = {}
  for _, k in ipairs(OPTIONS) do opts[k] = o[k] end
  if cb.oauthToken then opts.oauthToken = function(scope) return call("oauthToken", { scope }) end end
  if cb["effort.judge"] then
    opts.effort = { judge = function(text, ctx) return call("effort.judge", { text, { level = ctx.level } }) end }
  end
  local mem = type(o.memory) == "table" and o.memory or {}
  opts.memory = { visibility = mem.visibility }
  if cb["memory.promptBlock"] then
    opts.memory.promptBlock = function(channel, id, name, principal)
      return call("memory.promptBlock", { channel, id, name, principal })
    end
  end
  local tools = type(o.tools) == "table" and o.tools or nil
  if tools then
    opts.tools = { names = tools.names }
    if cb["tools.call"] then
      opts.tools.call = function(name, input, ctx)
        local sp = ctx.speaker
        return call("tools.call", { name, input, {
          channel = ctx.channel, profile = ctx.profile, thinking = ctx.thinking, deadline = epoch_ms(ctx.deadline),
          speaker = { id = sp.id, name = sp.name, principalId = sp.principalId },
        } }, ctx.signal)
      end
    end
  end
  local mcp = type(o.mcp) == "table" and o.mcp or nil
  if mcp then
    opts.mcp = { servers = mcp.servers }
    if cb["mcp.token"] then opts.mcp.token = function() return call("mcp.token", {}) end end
  end
  if cb.fetchImpl then
    opts.fetchImpl = function(req)
      local r = call("fetchImpl", { { method = req.method, url = req.url, headers = req.headers, body = req.body } }, req.signal)
      if type(r) ~= "table" then error("fetchImpl answered no response", 0) end
      local body = r.bodyBase64 ~= nil and core.base64_decode(r.bodyBase64) or (r.body or "")
      if body == nil then error("fetchImpl answered invalid base64", 0) end
      return { status = r.status, headers = r.headers, body = body }
    end
  end
  if cb.logger then
    local function line(level) return function(msg, fields) self:notify(owner, "logger." .. level, { msg, fields }) end end
    opts.logger = { info = line("info"), warn = line("warn"), error = line("error") }
  end
  if cb["compaction.compact"] and type(o.compaction) == "table" then
    local c = o.compaction
    opts.compaction = { engine = c.engine, timeoutMs = c.timeoutMs, maxRequestBytes = c.maxRequestBytes,
      compact = function(request, ctx) return call("compaction.compact", { request, { channel = ctx.channel } }, ctx.signal) end }
  end
  if cb["driver.ensureRunning"] then
    opts.driver = {
      ensureRunning = function(spec) return call("driver.ensureRunning", { spec }) end,
      remove = function(name) return call("driver.remove", { name }) end,
      status = function(name) return call("driver.status", { name }) end,
    }
    if cb["driver.logs"] then opts.driver.logs = function(name, n) return call("driver.logs", { name, n }) end end
  else
    local d = type(o.docker) == "table" and o.docker or {}
    local log = d.log
    if cb["docker.log"] then log = function(channel) return call("docker.log", { channel }) end end
    opts.driver = require("sandbox.rich").dockerDriver { socket = d.socket, labelProfile = o.labelProfile, log = log }
  end
  return opts
end

local function result_json(res)
  if not res.ok then return { ok = false, error = res.error, cause = res.cause } end
  local files = json.array()
  for i, f in ipairs(res.files or {}) do
    files[i] = json.object({ "name", "dataBase64" }, { name = f.name, dataBase64 = core.base64(f.data) })
  end
  return json.object({ "ok", "text", "files" }, { ok = true, text = res.text, files = files })
end

function M.register(H, U, util)
  local function the_runtime(self, req)
    local rt = runtimes(self)[util.need_owner(req)]
    if rt == nil then error(errors.EMBED_REQUEST .. "no Pi sandbox runtime " .. req.owner, 0) end
    return rt
  end

  H["rich.new"] = function(self, _, req)
    local owner = util.need_owner(req)
    if runtimes(self)[owner] ~= nil then error(errors.EMBED_REQUEST .. "Pi sandbox runtime " .. owner .. " exists", 0) end
    local o = type(req.options) == "table" and req.options or {}
    local rich = require "sandbox.rich"
    if req.config ~= nil then
      if type(req.config) ~= "string" or req.config == "" then error(errors.EMBED_REQUEST .. "config must be a non-empty string", 0) end
      local chunk, lerr = loadfile(req.config, "t")
      if not chunk then error(errors.CONFIG_LOAD .. tostring(lerr), 0) end
      local ok, rt = pcall(chunk, o)
      if not ok then error(rt, 0) end
      if not rich.is_runtime(rt) then error("config " .. req.config .. " must return sandbox.rich { ... }", 0) end
      runtimes(self)[owner] = rt
      return true
    end
    local cb = type(req.callbacks) == "table" and req.callbacks or {}
    runtimes(self)[owner] = rich(build_options(self, owner, o, cb))
    return true
  end

  H["rich.runTurn"] = function(self, rid, req)
    local rt = the_runtime(self, req)
    local t = type(req.turn) == "table" and req.turn or {}
    t.signal = util.request_signal(self, rid)
    return result_json(rt:runTurn(t))
  end

  local function channel_op(method)
    return function(self, _, req)
      local rt = the_runtime(self, req)
      local v = rt[method](rt, req.channel, req.profile)
      if v == nil then return true end
      return v
    end
  end
  H["rich.start"] = channel_op("start")
  H["rich.stop"] = channel_op("stop")
  H["rich.startFresh"] = channel_op("startFresh")
  H["rich.status"] = channel_op("status")
  H["rich.sessionsDir"] = channel_op("sessionsDir")
  H["rich.attachmentDir"] = channel_op("attachmentDir")

  H["rich.stopBrokers"] = function(self, _, req)
    the_runtime(self, req):stopBrokers()
    return true
  end

  -- the runtime's Prometheus text (spec/operations.md 4: its turns as
  -- sbx_turns_total{mode="rich",...}, its broker calls and refusals)
  H["rich.metrics"] = function(self, _, req)
    return the_runtime(self, req):metrics()
  end

  H["rich.dispose"] = function(self, _, req)
    local owner = util.need_owner(req)
    local rt = runtimes(self)[owner]
    if rt then rt:stopBrokers() end
    runtimes(self)[owner] = nil
    return true
  end

  for k in pairs(H) do
    if k:sub(1, 5) == "rich." then U[k] = true end
  end
end

return M
