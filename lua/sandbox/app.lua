-- app.lua: the chat-bot-facing sandbox (spec/runtime.md 2.1, 3.2, 5.6, 7, 9,
-- 10). This is what an embedding host (lua/sandbox/embed.lua over the C ABI,
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
-- (which build their own runtime from `app.options`). The app is also a
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
--                     -- splitter; default: commands.split (same rules)
--     log = function(level, msg, fields),        -- default runtime.log
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
--     webhookId = nil,              -- set: posted by an integration/webhook
--     mentionsBot = true, replyToBot = false,
--     text = "hello",
--     quoted = "replied-to message text" | nil,
--     attachments = { {...}, ... } | nil,   -- only counted, never fetched
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
--   app:status() -> { started=, channels={keys}, busy={keys}, queued={key=n} }
--   app:dispose()  (yields; idempotent) disposes the runtime.
local M = {}

M.SERVICE_ID = "sandbox.channels"
M.LIFECYCLE = "sandbox-runtime"
M.E_API_KEY = "apiKey is required when no host login is available"
M.E_STATE_ABSOLUTE = "stateFile must be absolute"
M.E_STATE_NAME = "stateFile must name a file"
M.E_STATE_MOUNTS = "routing state must stay outside sandbox mounts"
M.E_NOT_STARTED = "sandbox is not started"

local App = {}
App.__index = App
M.App = App

local function fail(msg) error(msg, 0) end

-- Wraps a checked config (init.lua) as an unstarted app. `Config` is the
-- config class whose methods (broker) the app keeps.
function M.wrap(cfg, Config)
  local mt = { __index = function(_, k)
    local v = App[k]
    if v ~= nil then return v end
    return Config[k]
  end }
  M.mt = mt
  return setmetatable({ options = cfg.options, started = false, services = {} }, mt)
end

function M.is_app(v)
  return M.mt ~= nil and getmetatable(v) == M.mt
end

function App:start(host)
  local _ = host
  fail("not yet implemented")
end

function App:claim(event, admission)
  local _ = { event, admission }
  fail("not yet implemented")
end

function App:handle(event, admission)
  local _ = { event, admission }
  fail("not yet implemented")
end

function App:command(event, admission)
  local _ = { event, admission }
  fail("not yet implemented")
end

function App:stop(key) local _ = key fail("not yet implemented") end
function App:start_fresh(key) local _ = key fail("not yet implemented") end
function App:background(key) local _ = key fail("not yet implemented") end
function App:owns(key) local _ = key fail("not yet implemented") end
function App:status() fail("not yet implemented") end
function App:dispose() fail("not yet implemented") end

return M
