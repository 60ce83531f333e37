-- fake_app.lua: a config for spec/c/ffi/ffi_test.c that returns a duck-typed
-- app (the methods of lua/sandbox/app.lua, no runtime, no Docker), so the
-- embedding ABI is tested on its own: claims, typing events, host apiKey
-- round trips, slow turns that end on dispose, commands, services, status.
local async = require "sandbox.async"
local core = require "sandbox.core"

local app = { options = {}, services = {}, running = 0, disposed = false, waiters = {} }

function app:start(host)
  self.host = host
  if host.failStart then error("start refused by the fake app", 0) end
  async.sleep(1)                         -- start may yield
  self.services.SANDBOX = {
    id = "sandbox.channels",
    channels = {
      keys = { ["discord:1"] = true },
      has = function(c, key) return c.keys[key] == true end,
      list = function(c)
        local out = {}
        for k in pairs(c.keys) do out[#out + 1] = k end
        table.sort(out)
        return out
      end,
      enable = function(c, key) c.keys[key] = true return true end,
      disable = function(c, key) c.keys[key] = nil return true end,
    },
    runtime = {
      busy = function() return app.running > 0 end,
      run_turn = function(_, channel, speaker, text)
        return { ok = true, text = channel .. "/" .. speaker.id .. ": " .. text }
      end,
    },
  }
  return self
end

function app:claim(event, admission)
  if event.channelId ~= "1" then return { claim = false, priority = 200 } end
  if admission == nil then return { claim = true, priority = 200, action = "drop" } end
  return { claim = true, priority = 200, action = "answer" }
end

local function wait_disposed(ms)
  if app.disposed then return "disposed" end
  return async.await(function(resume)
    local t = core.timer(ms, function() resume("timeout") end)
    app.waiters[#app.waiters + 1] = function() t:stop() resume("disposed") end
  end)
end

function app:handle(event, admission)
  local claim = self:claim(event, admission)
  if claim.action ~= "answer" then return nil end
  local stop_typing = self.host.typing(event)
  self.running = self.running + 1
  local text = event.text
  local reply
  if text == "slow" then
    reply = "slow ended: " .. wait_disposed(20000)
  elseif text == "key" then
    local key = self.host.apiKey({ channel = "discord:" .. event.channelId,
      speaker = { id = event.author.id, name = event.author.name, principalId = admission.principalId } })
    reply = "key=" .. tostring(key)
  elseif text == "raise" then
    self.running = self.running - 1
    stop_typing()
    error("fake turn exploded", 0)
  else
    reply = "echo: " .. tostring(text)
  end
  self.running = self.running - 1
  stop_typing()
  return { replies = { reply } }
end

function app:command(event)
  return { replies = { "sandbox " .. tostring(event.subcommand) }, ephemeral = true }
end

function app:stop(key) return key == "discord:1" end
function app:start_fresh() return "sandbox" end
function app:background() return { skipped = true, reason = "Background host turns are refused in sandbox channels." } end
function app:owns(key) return key == "discord:1" end

function app:status()
  return { started = true, channels = { "discord:1" }, running = self.running }
end

function app:dispose()
  self.disposed = true
  local w = self.waiters
  self.waiters = {}
  for _, f in ipairs(w) do f() end
  async.sleep(5)
end

return app
