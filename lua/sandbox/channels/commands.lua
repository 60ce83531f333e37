-- channels/commands.lua: the owner commands `/<root> sandbox on|off|status`
-- (spec/runtime.md 7.3, 9.5): the group definition the host registers, the
-- parsing of a command event and the action itself. The app (app.lua) runs
-- the action inside the channel queue after the owner and guild checks, so
-- `off` takes effect after the work queued before it and keeps the channel's
-- workspace and memory.
--
--   commands.definition(root) -> {command=root, group={name=, description=, subcommands=}}
--   commands.parse(event, root) -> "on" | "off" | "status" | nil
--   commands.key(event) -> "<surface>:<channelId>" | nil   (guild channels only)
--   commands.apply(store, key, sub) -> the resulting-state text
local claim = require "sandbox.channels.claim"
local errors = require "sandbox.errors"

local M = {}

M.DEFAULT_ROOT = "roundtable"
M.GROUP = "sandbox"
M.GROUP_DESCRIPTION = "Manage this channel's sealed guest agent"
M.SUBCOMMANDS = {
  { name = "on", description = "Route mentions and replies into a sealed container" },
  { name = "off", description = "Disable sandbox routing; keep channel memory" },
  { name = "status", description = "Show whether this channel is sandboxed" },
}

M.ENABLED = "Sandbox routing is enabled. Mention the bot or reply to it to start a sealed turn."
M.DISABLED = "Sandbox routing is disabled. Memory is retained; normal host routing applies again."
M.GUILD_ONLY = "Sandbox commands require a guild channel."
-- The host's owner guard and generic failure panel, when the host supplies
-- none of its own (app:start's host.refusal / host.failure override them).
M.NOT_OWNER = "Only the bot owner can use this command."
M.FAILED = "The command failed."
M.LOG_FAILED = errors.COMMAND_FAILED

local VALID = { on = true, off = true, status = true }

function M.definition(root)
  local subs = {}
  for i, s in ipairs(M.SUBCOMMANDS) do subs[i] = { name = s.name, description = s.description } end
  return {
    command = root or M.DEFAULT_ROOT,
    group = { name = M.GROUP, description = M.GROUP_DESCRIPTION, subcommands = subs },
  }
end

-- The subcommand of a command event: {command=<root>, group="sandbox",
-- subcommand=...}, or a text `/<root> sandbox <sub>`. nil when the event is
-- not one of ours.
function M.parse(event, root)
  if type(event) ~= "table" then return nil end
  root = root or M.DEFAULT_ROOT
  local cmd, group, sub = event.command, event.group, event.subcommand
  if not claim.present(cmd) then cmd = nil end
  if cmd == nil and group == nil and sub == nil and type(event.text) == "string" then
    cmd, group, sub = event.text:match("^%s*/(%S+)%s+(%S+)%s+(%S+)%s*$")
  end
  if cmd ~= nil and cmd ~= root then return nil end
  if group ~= M.GROUP or not VALID[sub] then return nil end
  return sub
end

-- Guild channels only: nil for a direct message or a missing channel id.
function M.key(event)
  local g = event.guildId
  if not ((type(g) == "string" and g ~= "") or math.type(g) == "integer") then return nil end
  return claim.key(event)
end

function M.state_text(enabled)
  return enabled and M.ENABLED or M.DISABLED
end

-- The action (inside the channel queue): enable / disable / nothing, then
-- the resulting state. Raises the store's errors.
function M.apply(store, key, sub)
  if sub == "on" then
    store:enable(key)
  elseif sub == "off" then
    store:disable(key)
  end
  return M.state_text(store:has(key))
end

return M
