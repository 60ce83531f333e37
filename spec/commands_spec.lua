-- commands_spec.lua: `/<root> sandbox on|off|status` (spec/runtime.md 7.3,
-- 9.5; "Behaviours the specs must cover" 61 and the mode rules of 51/59)
-- through a started app with a Lua fake driver, plus the module's pure
-- parts. Owner-only, guild-only, run inside the channel queue; `off` waits
-- for the work queued before it and keeps the workspace and memory files.
-- The runtime refuses uid 0: as root the app cases are pending.
local spec_fs = require "spec_fs"
local async = require "sandbox.async"
local commands = require "sandbox.channels.commands"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local sandbox = require "sandbox"
local fake = require "fake_driver"

local run = async.run

local ENABLED = "Sandbox routing is enabled. Mention the bot or reply to it to start a sealed turn."
local DISABLED = "Sandbox routing is disabled. Memory is retained; normal host routing applies again."
local GUILD_ONLY = "Sandbox commands require a guild channel."

local roots, apps = {}, {}

local function tmproot() return spec_fs.tmpdir("cm", roots) end

local read = spec_fs.read

local function service_account() return spec_fs.service_account(pending) end

local function start_app(root, over, host)
  local o = {
    image = "pi-roundtable-sandbox:test", runRoot = root .. "/run", workspaceRoot = root .. "/work",
    stateFile = root .. "/state/channels.json", model = "fake",
    modelUrl = "https://models.example/v1/chat/completions", apiKey = function() return "k" end,
    driver = fake.new(fake.reply(true, "Sealed.")),
  }
  for k, v in pairs(over or {}) do o[k] = v end
  local app = sandbox(o)
  local h = { slashCommands = true }
  for k, v in pairs(host or {}) do h[k] = v end
  run(function() app:start(h) end)
  apps[#apps + 1] = app
  return app
end

after_each(function()
  for _, app in ipairs(apps) do pcall(run, function() app:dispose() end) end
  apps = {}
end)

teardown(function() spec_fs.rmdirs(roots) end)

local OWNER = { tier = "owner", principalId = "owner" }
local MEMBER = { tier = "member", principalId = "p_alice" }

local function cmd(sub, over)
  local e = {
    type = "command", channelId = "123456789", guildId = "g1",
    author = { id = "owner", name = "Ada" }, command = "roundtable", group = "sandbox", subcommand = sub,
  }
  for k, v in pairs(over or {}) do e[k] = v end
  return e
end

local function message(over)
  local e = {
    type = "message", channelId = "123456789", guildId = "g1",
    author = { id = "alice", name = "Alice" }, mentionsBot = true, text = "hi",
  }
  for k, v in pairs(over or {}) do e[k] = v end
  return e
end

local function panel(text)
  return { replies = { text }, ephemeral = true }
end

describe("commands module", function()
  it("defines the sandbox group with the spec's descriptions", function()
    assert.same({
      command = "roundtable",
      group = {
        name = "sandbox", description = "Manage this channel's sealed guest agent",
        subcommands = {
          { name = "on", description = "Route mentions and replies into a sealed container" },
          { name = "off", description = "Disable sandbox routing; keep channel memory" },
          { name = "status", description = "Show whether this channel is sandboxed" },
        },
      },
    }, commands.definition())
    assert.equal("rt", commands.definition("rt").command)
  end)

  it("parses structured and text command events for its root only", function()
    assert.equal("on", commands.parse(cmd("on")))
    assert.equal("status", commands.parse({ group = "sandbox", subcommand = "status" }))
    assert.equal("off", commands.parse({ text = "/roundtable sandbox off" }))
    assert.equal("off", commands.parse({ text = "/rt sandbox off" }, "rt"))
    assert.is_nil(commands.parse({ text = "/other sandbox off" }))
    assert.is_nil(commands.parse(cmd("delete")))
    assert.is_nil(commands.parse(cmd("on", { group = "agent" })))
    assert.is_nil(commands.parse(cmd("on", { command = "other" })))
    assert.is_nil(commands.parse("on"))
  end)

  it("keys guild channels as discord:<channelId> and refuses direct messages", function()
    assert.equal("discord:123456789", commands.key(cmd("on")))
    assert.is_nil(commands.key(cmd("on", { guildId = "" })))
    local dm = cmd("on")
    dm.guildId = nil
    assert.is_nil(commands.key(dm))
    assert.is_nil(commands.key(cmd("on", { channelId = "" })))
  end)
end)

describe("/<root> sandbox on|off|status (7.3, 9.5)", function()
  it("R61: on, status and off reply with the exact state texts and persist", function()
    if not service_account() then return end
    local root = tmproot()
    local app = start_app(root)
    run(function()
      assert.same(panel(DISABLED), app:command(cmd("status"), OWNER))
      assert.same(panel(ENABLED), app:command(cmd("on"), OWNER))
      assert.is_true(app:owns("discord:123456789"))
      assert.equal('["discord:123456789"]', read(root .. "/state/channels.json"))
      assert.same(panel(ENABLED), app:command(cmd("status"), OWNER))
      assert.same(panel(ENABLED), app:command(cmd("on"), OWNER))
      assert.same(panel(DISABLED), app:command(cmd("off"), OWNER))
      assert.is_false(app:owns("discord:123456789"))
      assert.equal("[]", read(root .. "/state/channels.json"))
      assert.same(panel(DISABLED), app:command(cmd("off"), OWNER))
    end)
  end)

  it("R61: a non-owner is refused and changes nothing", function()
    if not service_account() then return end
    local app = start_app(tmproot())
    run(function()
      local member = cmd("on", { author = { id = "alice", name = "Alice" } })
      assert.same(panel(commands.NOT_OWNER), app:command(member, MEMBER))
      assert.same(panel(commands.NOT_OWNER), app:command(member, nil))
    end)
    assert.is_false(app:owns("discord:123456789"))
  end)

  it("R61: outside a guild channel the owner sees the guild-only text; a non-owner only the refusal", function()
    if not service_account() then return end
    local app = start_app(tmproot())
    run(function()
      local dm = cmd("on")
      dm.guildId = nil
      assert.same(panel(GUILD_ONLY), app:command(dm, OWNER))
      assert.same(panel(GUILD_ONLY), app:command(cmd("status", { channelId = "" }), OWNER))
      assert.same(panel(commands.NOT_OWNER), app:command(dm, MEMBER))
    end)
    assert.same({}, app.services.SANDBOX.channels:list())
  end)

  it("uses the host's owner guard and refusal panel when given", function()
    if not service_account() then return end
    local app = start_app(tmproot(), nil, {
      isOwner = function(e) return e.author.id == "primary" end, refusal = "Owners only.",
    })
    run(function()
      assert.same(panel("Owners only."), app:command(cmd("on"), OWNER))
      assert.same(panel(ENABLED), app:command(cmd("on", { author = { id = "primary", name = "P" } }), nil))
    end)
  end)

  it("a command goes through app:claim/app:handle as action `command`; another root is not claimed", function()
    if not service_account() then return end
    local app = start_app(tmproot(), nil, { rootCommand = "rt" })
    assert.same({ claim = true, priority = 200, action = "command" }, app:claim(cmd("on", { command = "rt" }), OWNER))
    assert.is_false(app:claim(cmd("on"), OWNER).claim)
    run(function()
      assert.same(panel(ENABLED), app:handle(cmd("on", { command = "rt" }), OWNER))
    end)
    assert.is_true(app:owns("discord:123456789"))
  end)

  it("a failed save becomes the generic panel, logs state_write_failed with the errno and `owner command failed`, and changes nothing", function()
    if not service_account() then return end
    local root = tmproot()
    local lines, fixes = {}, {}
    local app = start_app(root, nil, { log = function(level, msg, fields)
      lines[#lines + 1] = level .. " " .. msg .. (fields and fields.reason and (" reason=" .. fields.reason
        .. " errno=" .. fields.errno) or "")
      fixes[#lines] = fields and fields.fix
    end })
    assert(core.fs_mkdir(root .. "/state/channels.json.tmp"))
    run(function()
      assert.same(panel(commands.FAILED), app:command(cmd("on"), OWNER))
    end)
    assert.same({ "error routing state could not be saved reason=state_write_failed errno=EISDIR",
      "error owner command failed" }, lines)
    assert.equal(errors.reason_fix("state_write_failed"), fixes[1])
    assert.is_false(app:owns("discord:123456789"))
    assert.equal("[]", read(root .. "/state/channels.json"))
  end)

  it("threads are enabled on their own key and inherit nothing", function()
    if not service_account() then return end
    local app = start_app(tmproot())
    run(function()
      app:command(cmd("on"), OWNER)
      assert.same(panel(DISABLED), app:command(cmd("status", { channelId = "777", threadParentId = "123456789" }), OWNER))
    end)
    assert.is_false(app:claim(message { channelId = "777", threadParentId = "123456789" }, MEMBER).claim)
  end)

  it("off runs after the work queued before it, then the channel is the host's again; memory stays", function()
    if not service_account() then return end
    local waiting = {}
    local driver = fake.new(function(spec, turn)
      async.await(function(resume) waiting[#waiting + 1] = resume end)
      local f = assert(io.open(spec.workspaceDir .. "/memory.json", "a"))
      f:write(turn.text)
      f:close()
      return { ok = true, text = "echo " .. turn.text }
    end)
    local app = start_app(tmproot(), { initialChannels = { "discord:123456789" }, driver = driver })
    local order = {}
    run(function()
      local t1 = async.spawn(function()
        local r = app:handle(message { text = "one" }, MEMBER)
        order[#order + 1] = r.replies[1]
      end)
      local t2 = async.spawn(function()
        local r = app:handle(message { text = "two" }, MEMBER)
        order[#order + 1] = r.replies[1]
      end)
      local off = async.spawn(function()
        local r = app:command(cmd("off"), OWNER)
        order[#order + 1] = r.replies[1]
      end)
      local late = async.spawn(function()
        local r = app:handle(message { text = "three" }, MEMBER)
        order[#order + 1] = r == nil and "nothing" or r.replies[1]
      end)
      while #waiting == 0 do async.sleep(5) end
      assert.is_true(app:owns("discord:123456789"))         -- off waits its turn
      table.remove(waiting, 1)()
      while #waiting == 0 do async.sleep(5) end
      table.remove(waiting, 1)()
      for _, t in ipairs { t1, t2, off, late } do assert.is_true((async.wait(t))) end
    end)
    assert.same({ "echo one", "echo two", DISABLED, "nothing" }, order)
    assert.equal(2, #driver.calls)
    local ws = driver.calls[1].spec.workspaceDir
    assert.equal("onetwo", read(ws .. "/memory.json"))
    -- not sandboxed any more: the host routes it
    assert.is_false(app:claim(message(), MEMBER).claim)
    -- on again: the same workspace, memory intact
    run(function()
      waiting = {}
      app:command(cmd("on"), OWNER)
      local t = async.spawn(app.handle, app, message { text = "four" }, MEMBER)
      while #waiting == 0 do async.sleep(5) end
      table.remove(waiting, 1)()
      async.wait(t)
    end)
    assert.equal(ws, driver.calls[3].spec.workspaceDir)
    assert.equal("onetwofour", read(ws .. "/memory.json"))
  end)
end)
