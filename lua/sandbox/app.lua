-- app.lua: the chat-bot-facing sandbox (spec/runtime.md 2.1, 3.2, 5.6, 7, 9,
-- 10). This is what an embedding host (lua/sandbox/embed/init.lua over the C ABI,
-- the Bun bridge) drives. Trusted host code only: nothing here is reachable
-- by a guest except through app:claim/app:handle/app:command with the host's
-- own event and admission result.
--
-- HOW `sandbox{...}` RETURNS THE APP
--
--   local app = require("sandbox") { image=..., runRoot=..., workspaceRoot=...,
--                                    stateFile=..., initialChannels={...}, ... }
--
-- `sandbox{...}` (init.lua M.new) only checks the option names and the
-- option values it can check without side effects, and returns an app that
-- is NOT started yet: it creates no directory, takes no lock and starts no
-- runtime, so config scripts stay loadable by `sbx run/chat/doctor/cleanup`
-- (`sbx run` and `sbx chat` build their runtime from
-- `app:runtime_options(host)`, as app:start does). The app is also a
-- config: `sandbox.is_config(app)` is true, `app.options` and
-- `app:broker{...}` keep working. The embedding host then calls, inside a
-- task (async.spawn/async.run; it may yield):
--
--   app:start(host)   -- spec/runtime.md 3.2 steps 2-9; raises the spec's
--                     -- error strings; returns app. A failure in steps 4-7
--                     -- disposes the runtime (its lock) first.
--
--   host = {          -- every field optional
--     hostLogin = function(provider) -> key|nil,  -- the host login reader;
--                     -- called on every model call (apiKey absent). Without it
--                     -- and without apiKey: `apiKey is required when no host
--                     -- login is available`.
--     timeZone = "Europe/London",   -- the host's zone (default "UTC")
--     rootCommand = "roundtable",   -- the host's rootCommand setting
--     slashCommands = true,         -- a chat surface with slash commands is
--                     -- present: app.commands holds the `sandbox` group
--     isOwner = function(event, admission) -> boolean,
--                     -- the host's owner guard (primary owner id or an owner
--                     -- principal); default: admission.tier == "owner"
--     typing = function(event) -> stop_fn|nil,   -- typing indicator (9.3.2)
--     split = function(text) -> {pieces},        -- the host's 2,000-char
--                     -- splitter; default: claim.split (same rules)
--     refusal = "...",  -- the owner guard's refusal panel text
--                     -- (default commands.NOT_OWNER)
--     failure = "...",  -- the generic owner-command failure panel text
--                     -- (default commands.FAILED)
--     log = function(level, msg, fields),        -- where the operator lines go
--                     -- when the options name no `logger` (default: stderr in
--                     -- logFormat); the runtime's lines go there too
--   }
--
-- EVENT SHAPE (a message as the host's router sees it; JSON-able)
--
--   { type = "message",             -- or "command" (a slash command, below)
--     id = "m1",
--     surface = "discord",          -- channel-key prefix; default "discord"
--     channelId = "123",            -- channel key = surface .. ":" .. channelId
--     guildId = "9" | nil,          -- nil/"" = direct message
--     threadParentId = "122" | nil, -- informational only: threads are their
--                                   -- own keys and inherit nothing
--     author = { id = "alice", name = "Alice" (surface display name, e.g.
--                server nickname), bot = false, integration = false },
--     webhookId = nil, applicationId = nil,  -- either set: posted by an
--                                   -- integration (webhook or app)
--     mentionsBot = true, replyToBot = false,
--     text = "hello",
--     quoted = "replied-to message text" | {text=...} | nil,
--     attachments = { {...}, ... } | count | nil,  -- never fetched
--   }
--
--   a slash command: { type = "command", surface, channelId, guildId, author,
--     command = "<rootCommand>", group = "sandbox",
--     subcommand = "on"|"off"|"status" }
--
-- ADMISSION RESULT (the host's access rules for this author):
--   { tier = "member", principalId = "p_alice" } or nil (unknown author, no
--   tier: the message is dropped silently).
--
-- OPERATIONS (all raise only programming errors; guest-visible texts are the
-- spec's exact strings, see claim.lua / commands.lua constants)
--
--   app:claim(event, admission) -> { claim = bool, priority = 200,
--        action = "answer" | "drop" | "command" | nil }
--     Pure decision (store membership + event + admission), no side effect.
--     claim=false (action nil) when the channel is not sandboxed and the event
--     is a message: the host routes it normally. A sandbox channel claims
--     every message: "answer" when admitted (9.2), otherwise "drop" (never
--     falls through to a host agent). Command events: claim=true, "command".
--   app:handle(event, admission) -> { replies = {text, ...} } | nil   (yields)
--     Runs the decided action: "answer" through the channel queue (9.3:
--     re-check mode, typing, compose, run_turn, split); "drop" -> nil;
--     "command" -> app:command(...). nil also when the channel was switched
--     off while the message waited.
--   app:command(event, admission) -> { replies = {text}, ephemeral = true }
--     (yields) `/<root> sandbox on|off|status` (9.5), owner-only,
--     guild-only, run inside the channel queue.
--   app:stop(key) -> boolean            runtime:stop (9.4)
--   app:start_fresh(key) -> "sandbox"   runtime:start_fresh (7.4, 9.4)
--   app:background(key) -> { skipped = true, reason = ... } | nil   (9.4)
--   app:owns(key) -> boolean
--   app.services.SANDBOX = { id = "sandbox.channels",
--       channels = <store: :has(key) :list() :enable(key) :disable(key)>,
--       runtime  = <runtime: :run_turn :start_fresh :stop :busy :dispose :sweep> }
--   app.services.lifecycle = { name = "sandbox-runtime",
--       busy = function() -> keys, stop = function() (yields: dispose) }
--   app.commands = the `sandbox` group definition (commands.definition) or nil
--   app:status() -> { started=, disposed=, channels={keys}, busy={keys},
--                     queued={key=n} }   (lists are json.array, queued a
--                     json.object: json.encode keeps [] and {} apart)
--   app:metrics() -> the Prometheus text exposition of the runtime
--                     (spec/operations.md 4; raises `sandbox is not started`
--                     before start); the channel queue's waiting turns are
--                     its sbx_channel_queue_depth
--   app:dispose()  (yields; idempotent) disposes the runtime.
--   app:runtime_options(host) -> opts, checked: what app:start hands
--     sandbox.runtime.new (3.2 steps 2-3: the options without stateFile,
--     initialChannels and provider; apiKey resolved; the host's time zone)
--     and the broker configuration sandbox{} already checked.
--
-- start, handle, command and dispose yield: call them inside a task
-- (async.spawn / async.run). claim, owns, stop, start_fresh, background,
-- status and metrics never yield. Before start nothing is owned: claim
-- answers claim=false for messages, handle returns nil, owns/background/
-- status answer; command, stop, start_fresh and metrics raise `sandbox is
-- not started`.
local channels = require "sandbox.channels"
local claim = require "sandbox.channels.claim"
local commands = require "sandbox.channels.commands"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local log = require "sandbox.log"
local reply_text = require "sandbox.channels._reply_text"
local runtime = require "sandbox.runtime"
local turn_queue = require "sandbox.channels._queue"

local M = {}

M.SERVICE_ID = "sandbox.channels"
M.LIFECYCLE = "sandbox-runtime"
M.DEFAULT_TIME_ZONE = "UTC"
M.E_API_KEY = errors.API_KEY_REQUIRED
M.E_NOT_STARTED = errors.NOT_STARTED
M.LOG_STATE = "routing state could not be opened"

-- Options of `sandbox{}` that the runtime does not take (2.1).
local APP_ONLY = { stateFile = true, initialChannels = true, provider = true, maxQueuedTurns = true }

local App = {}
M.App = App

local function fail(msg) error(msg, 0) end

-- Wraps a checked config (init.lua) as an unstarted app. `Config` is the
-- config class whose methods (broker) the app keeps.
function M.wrap(cfg, Config)
  if M.mt == nil then
    M.mt = { __index = function(_, k)
      local v = App[k]
      if v ~= nil then return v end
      return Config[k]
    end }
  end
  return setmetatable({ options = cfg.options, broker_config = cfg.broker_config, started = false,
    services = {} }, M.mt)
end

function M.is_app(v)
  return M.mt ~= nil and getmetatable(v) == M.mt
end

-- The one operator logger: the runtime's once started, else one made from
-- the same options (spec/operations.md 2).
function App:_logger()
  if self.rt then return self.rt.logger end
  if not self.early_logger then
    self.early_logger = log.from_options(self.options, self.host and self.host.log or nil)
  end
  return self.early_logger
end

function App:_log(level, msg, fields)
  self:_logger():log(level, msg, fields)
end

local function require_started(self)
  if not self.started then fail(M.E_NOT_STARTED) end
end

-- §3.2 step 2: the apiKey the runtime gets.
local function resolve_api_key(o, host)
  if o.apiKey ~= nil then
    if type(o.apiKey) ~= "function" then fail(errors.API_KEY_TYPE) end
    return o.apiKey
  end
  if o.modelAuth == "none" then return nil end      -- never called (providers.md 1)
  local login = host.hostLogin
  if type(login) ~= "function" then fail(M.E_API_KEY) end
  local provider = o.provider or "openai"
  -- re-read on every call, so a refreshed login applies without a restart;
  -- the scope is ignored (2.3)
  return function() return login(provider) end
end

-- §3.2 steps 2-3: the options of `sandbox.runtime{}` this app runs with
-- for `host` (see the header), and the checked broker configuration to hand
-- runtime.new with them. The one path from sandbox{} options to a runtime:
-- app:start and `sbx run`/`sbx chat` both take it.
function App:runtime_options(host)
  host = host or {}
  if type(host) ~= "table" then fail(errors.HOST_TABLE) end
  local o = self.options
  local opts = {}
  for k, v in pairs(o) do
    if not APP_ONLY[k] then opts[k] = v end
  end
  opts.apiKey = resolve_api_key(o, host)                             -- step 2
  opts.timeZone = host.timeZone or M.DEFAULT_TIME_ZONE
  return opts, self.broker_config
end

-- spec/runtime.md 3.2 steps 2-9. Inside a task. Returns self.
function App:start(host)
  if self.started then return self end
  if self.disposed then fail(runtime.E_BUSY) end
  host = host or {}
  local o = self.options
  local opts, checked = self:runtime_options(host)
  local rt = runtime.new(opts, checked, host)                         -- steps 2-3
  local store_path
  local ok, store = pcall(function()
    store_path = channels.state_path(o.stateFile, rt.options.runRoot,   -- steps 4-6
      rt.options.workspaceRoot)
    return channels.open {                                            -- step 7
      stateFile = store_path, initialChannels = o.initialChannels,
      log = function(level, msg, fields) self:_log(level, msg, fields) end,
    }
  end)
  if not ok then
    local fix = errors.fix(store)
    if fix then
      rt.logger:error(M.LOG_STATE, { file = store_path or o.stateFile, fix = fix })
    end
    rt:dispose()
    error(store, 0)
  end
  self.host, self.rt, self.store = host, rt, store
  self.root = host.rootCommand or commands.DEFAULT_ROOT
  self.queue = turn_queue.new { max = o.maxQueuedTurns }
  rt.metrics_registry:queue_source(function() return self.queue:waiting_total() end)
  self.services = {                                                   -- step 8
    SANDBOX = { id = M.SERVICE_ID, channels = store, runtime = rt },
    lifecycle = {                                                     -- step 9
      name = M.LIFECYCLE,
      busy = function() return rt:busy() end,
      stop = function() return self:dispose() end,
    },
  }
  if host.slashCommands then self.commands = commands.definition(self.root) end
  self.started = true
  return self
end

function App:owns(key)
  return self.started and self.store:has(key) or false
end

-- The routing decision (pure: store membership, event, admission).
function App:claim(event, admission)
  if type(event) == "table" and event.type == "command"
      and commands.parse(event, self.root or self.host and self.host.rootCommand) == nil then
    return { claim = false, priority = claim.PRIORITY }
  end
  return claim.decide(event, admission, function(key) return self:owns(key) end)
end

-- §9.3, inside the channel queue.
function App:_answer(key, event, speaker)
  if not self.store:has(key) then return nil end                      -- step 1
  local stop_typing
  if self.host.typing then                                            -- step 2
    local ok, stop = pcall(self.host.typing, event)
    if ok and type(stop) == "function" then stop_typing = stop end
  end
  local ok, text = pcall(function()
    return (self.rt:guest_turn(key, speaker, claim.compose(event)))   -- steps 3-4, 6
  end)
  if stop_typing then pcall(stop_typing) end
  if not ok then
    self:_log("error", runtime.LOG_REFUSED, { channel = key })
    text = runtime.GUEST_FAILED_OR_STOPPED
  end
  -- the turn's reason is the operator's (its `turn finished` line, and
  -- rt:run_turn's result through the SANDBOX service), never the guest's
  return self:_replies(text)                                          -- step 5
end

-- The reply pieces of a guest-visible text (the host's splitter, §9.3 step
-- 5) and, with mentions = "neutral", the allowedMentions the chat adapter
-- passes on (shared/spec/hardening.md 6).
function App:_replies(text)
  local split = self.host.split or claim.split
  local sok, pieces = pcall(split, text)
  if not sok or type(pieces) ~= "table" then pieces = claim.split(text) end
  local out = { replies = pieces }
  if self.rt.options.mentions == "neutral" then out.allowedMentions = reply_text.ALLOWED_MENTIONS() end
  return out
end

-- Runs the decided action. Inside a task. A mention beyond the channel's
-- queue bound (maxQueuedTurns, 2 per speaker; shared/spec/hardening.md 4)
-- is not queued: the guest gets the busy text and the operator the audit
-- line `turn refused reason=queue_full`.
function App:handle(event, admission)
  local d = self:claim(event, admission)
  if d.action == "command" then return self:command(event, admission) end
  if d.action ~= "answer" then return nil end
  local key = claim.key(event)
  local speaker = claim.admit(event, admission)
  local res, full = self.queue:run_turn(key, speaker.id, self._answer, self, key, event, speaker)
  if full then
    local why = errors.entry(errors.QUEUE_FULL).reason
    self:_log("warn", runtime.LOG_REFUSED, { channel = key, reason = why, fix = errors.reason_fix(why) })
    return self:_replies(runtime.GUEST_BUSY)
  end
  return res
end

function App:_is_owner(event, admission)
  local guard = self.host.isOwner
  if type(guard) == "function" then
    local ok, yes = pcall(guard, event, admission)
    return ok and yes == true
  end
  return type(admission) == "table" and admission.tier == "owner"
end

local function panel(text)
  return { replies = { text }, ephemeral = true }
end

-- `/<root> sandbox on|off|status` (9.5). Inside a task.
function App:command(event, admission)
  require_started(self)
  local host = self.host
  local sub = commands.parse(event, self.root)
  if sub == nil then return panel(host.failure or commands.FAILED) end
  if not self:_is_owner(event, admission) then return panel(host.refusal or commands.NOT_OWNER) end
  local key = commands.key(event)
  if key == nil then return panel(commands.GUILD_ONLY) end
  local ok, text = pcall(self.queue.run, self.queue, key, commands.apply, self.store, key, sub)
  if ok and sub == "off" then self.rt:cool(key) end          -- spec/warm-turns.md 2
  if not ok then
    self:_log("error", commands.LOG_FAILED)
    return panel(host.failure or commands.FAILED)
  end
  return panel(text)
end

-- §9.4
function App:stop(key)
  require_started(self)
  return self.rt:stop(key)
end

function App:start_fresh(key)
  require_started(self)
  self.rt:start_fresh(key)
  return claim.CONVERSATION_KIND
end

function App:background(key)
  if self:owns(key) then return { skipped = true, reason = claim.BACKGROUND_REFUSED } end
  return nil
end

-- A JSON-able summary for the host's status views.
function App:status()
  local names, counts = {}, {}
  if self.started then
    for k, n in pairs(self.queue.counts) do
      names[#names + 1] = k
      counts[k] = n
    end
    table.sort(names)
  end
  local queued = json.object(names, counts)
  return {
    started = self.started == true,
    disposed = self.disposed == true,
    channels = json.array(self.started and self.store:list() or {}),
    busy = json.array(self.started and self.rt:busy() or {}),
    queued = queued,
  }
end

-- The Prometheus text exposition (spec/operations.md 4). Never yields.
function App:metrics()
  require_started(self)
  return self.rt:metrics()
end

-- Disposes the runtime (5.6): aborts active turns and waits for them.
-- Idempotent. The store stays readable.
function App:dispose()
  self.disposed = true
  if self.rt then return self.rt:dispose() end
end

return M
