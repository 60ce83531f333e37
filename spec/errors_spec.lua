-- errors_spec.lua: the operator error catalogue (lua/sandbox/errors.lua):
-- each message once, the modules' constants are its strings, fixes render
-- with the operator's paths, and only catalogue text is safe to print.
local errors = require "sandbox.errors"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function lua_files(dir)
  local p = assert(io.popen("find " .. dir .. " -name '*.lua' | sort"))
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  return out
end

describe("the catalogue", function()
  it("names every entry once and exposes its message as errors.<NAME>", function()
    local names, messages = {}, {}
    for _, e in ipairs(errors.catalogue) do
      assert.is_nil(names[e.name], e.name)
      assert.is_nil(messages[e.message], e.message)
      names[e.name], messages[e.message] = true, true
      assert.matches("^[A-Z][A-Z0-9_]*$", e.name)
      assert.equal(e.message, errors[e.name])
      assert.is_boolean(e.safe)
    end
  end)

  it("is the only place in lua/sandbox that spells a catalogue message", function()
    for _, path in ipairs(lua_files("lua/sandbox")) do
      if path ~= "lua/sandbox/errors.lua" then
        local src = read(path)
        for _, e in ipairs(errors.catalogue) do
          assert.is_nil(src:find('"' .. e.message .. '"', 1, true), path .. " spells " .. e.name)
        end
      end
    end
  end)

  it("is what the modules raise: their public constants are the catalogue's strings", function()
    local runtime = require "sandbox.runtime"
    local options = require "sandbox.runtime._options"
    local installation = require "sandbox.runtime._installation"
    local container = require "sandbox.drivers._sealed"
    local cli = require "sandbox.drivers.cli"
    local contract = require "sandbox.drivers.contract"
    local broker = require "sandbox.broker"
    local broker_config = require "sandbox.broker._config"
    local channels = require "sandbox.channels"
    local app = require "sandbox.app"
    for _, cleanup in ipairs { runtime.E_CLEANUP, installation.E_CLEANUP, cli.E_CLEANUP, contract.E_CLEANUP } do
      assert.equal("sandbox container cleanup failed; inspect this installation's containers", cleanup)
    end
    assert.equal(errors.REPLY, runtime.E_REPLY)
    assert.equal(errors.REPLY, cli.E_REPLY)
    assert.equal(errors.LOCKED, runtime.E_LOCK)
    assert.equal(errors.LOCKED, installation.E_LOCKED)
    assert.equal(errors.SOCKET_TOO_LONG, broker.SOCKET_TOO_LONG)
    assert.equal(errors.SOCKET_TOO_LONG, options.E_SOCKET)
    assert.equal(errors.NAME_IMAGE, container.E_NAME_IMAGE)
    assert.equal(errors.TOOL, broker_config.E_TOOL)
    assert.equal(errors.STATE_INVALID, channels.E_INVALID_STATE)
    assert.equal(errors.API_KEY_REQUIRED, app.E_API_KEY)
    assert.equal("sandbox turn timed out", runtime.TIMED_OUT)
  end)
end)

describe("errors.entry / fix / safe_to_show", function()
  it("finds an exact message and a prefix entry with its detail", function()
    assert.equal("CLEANUP", errors.entry(errors.CLEANUP).name)
    assert.equal("UNKNOWN_OPTION", errors.entry("unknown sandbox option: imgae").name)
    assert.is_nil(errors.entry("sandbox container cleanup failed"))   -- not the whole message
    assert.is_nil(errors.entry("driver exploded"))
    assert.is_nil(errors.entry(nil))
    assert.is_nil(errors.entry({ message = errors.CLEANUP }))
  end)

  it("renders a fix with the operator's config path and roots, with placeholders when unknown", function()
    assert.equal("inspect this installation's containers; `sbx cleanup /etc/sbx.lua --force`",
      errors.fix(errors.CLEANUP, { config = "/etc/sbx.lua" }))
    assert.equal("inspect this installation's containers; `sbx cleanup CONFIG.lua --force`", errors.fix(errors.CLEANUP))
    assert.equal("chown sbx: /r /w && chmod 700 /r /w (run `sbx doctor c.lua` to see which)",
      errors.fix(errors.ROOT_PRIVATE, { user = "sbx", runRoot = "/r", workspaceRoot = "/w", config = "c.lua" }))
    assert.equal("remove uid/gid from the config or set uid = 1000, gid = 1001",
      errors.fix(errors.USER, { uid = 1000, gid = 1001 }))
    assert.matches("runuser %-u sbx", errors.fix(errors.USER, { uid = 0, gid = 0 }))
    assert.is_nil(errors.fix(errors.PROMPT))
    assert.is_nil(errors.fix("driver exploded"))
  end)

  it("shows catalogue text only; a prefix whose detail is not the operator's own is not safe", function()
    assert.is_true(errors.safe_to_show(errors.WORKER))
    assert.is_true(errors.safe_to_show("unknown sandbox option: imgae"))
    assert.is_false(errors.safe_to_show(errors.TURN_ENCODING .. "some encoder detail"))
    assert.is_false(errors.safe_to_show("sandbox worker failed: and a payload"))
    assert.is_false(errors.safe_to_show("boom"))
  end)

  it("names the operations.md failure reason of the errors that end a turn", function()
    assert.equal("cleanup_failed", errors.entry(errors.CLEANUP).reason)
    assert.equal("deadline", errors.entry(errors.TIMED_OUT).reason)
    assert.equal("stopped", errors.entry(errors.STOPPED).reason)
    assert.equal("worker_failed", errors.entry(errors.WORKER).reason)
    assert.equal("invalid_reply", errors.entry(errors.REPLY).reason)
  end)
end)

describe("one catalogue for every mode and subsystem (issue 21 item 6)", function()
  it("the delegator, the research worker, scrub, the owner commands, the embedding and precheck read their messages from it", function()
    local delegator = require "sandbox.delegator"
    local research = require "sandbox.delegator.research"
    local scrub = require "sandbox.delegator.scrub"
    local commands = require "sandbox.channels.commands"
    local run = require "sandbox.precheck._run"
    assert.equal(errors.DELEGATION_BUDGET, delegator.E_BUDGET)
    assert.equal(errors.DELEGATION_SCOPE, delegator.E_SCOPE)
    assert.equal(errors.DELEGATION_DELIVER_FAILED, delegator.LOG_DELIVER_FAILED)
    assert.equal(errors.RESEARCH_NEEDS_FETCH, research.E_NEEDS_FETCH)
    assert.equal(errors.RESEARCH_OPTION, research.E_OPTION)
    assert.equal(errors.DIAGNOSTIC_LIMIT, scrub.E_LIMIT)
    assert.equal(errors.COMMAND_FAILED, commands.LOG_FAILED)
    assert.equal(errors.reason_fix("run_dir"), run.RUN_DIR_FIX)
    -- each with its fix where the operator can act
    assert.truthy(errors.fix(errors.DELEGATION_CALLBACKS))
    assert.truthy(errors.fix(errors.RESEARCH_NEEDS_SEARCH))
    assert.truthy(errors.fix(errors.EMBED_OPTIONS .. "logger must be a boolean"))
    assert.truthy(errors.fix(errors.EMBED_REQUEST .. "owner must be a non-empty string"))
    -- a config's load error may quote the file: never shown without SBX_DEBUG
    assert.is_false(errors.safe_to_show(errors.CONFIG_LOAD .. "x.lua: No such file"))
  end)

  it("the rich and precheck reasons and fixes are the catalogue's: a precheck root refusal names runRoot alone", function()
    local ctx = { mode = "precheck", runRoot = "/srv/pre", user = "sbx" }
    assert.equal("chown sbx: /srv/pre && chmod 700 /srv/pre", errors.fix(errors.ROOT_PRIVATE, ctx))
    assert.matches("set runRoot to the absolute path", errors.fix(errors.ROOT_PATH, ctx), 1, true)
    assert.matches("workspaceRoot", errors.fix(errors.ROOT_PATH, {}), 1, true)
    for _, r in ipairs(errors.PRECHECK_REASONS) do assert.truthy(errors.reason(r), r) end
    assert.equal("raise turnTimeoutMs if turns need longer", errors.fix(errors.RICH_TIMED_OUT))
  end)
end)
