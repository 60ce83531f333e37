-- sandbox_spec.lua: the `require "sandbox"` entry (lua/sandbox/init.lua;
-- spec/runtime.md 2.1-2.2, 3.2 step 1): what sandbox{} checks before any
-- side effect, the config it returns, the one path from its options to a
-- runtime (app:runtime_options) and the names a host script reaches.
-- Starting the app is app_spec's.
local core = require "sandbox.core"
local sandbox = require "sandbox"
local spec_fs = require "spec_fs"

local function options(over)
  local o = {
    image = "pi-roundtable-sandbox:test", runRoot = "/nonexistent/sbx-spec/run",
    workspaceRoot = "/nonexistent/sbx-spec/work", stateFile = "/nonexistent/sbx-spec/state/c.json",
    initialChannels = { "fake:a" }, model = "fake", modelUrl = "https://models.example/v1/chat/completions",
  }
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

local function refusal(o)
  local ok, err = pcall(sandbox, o)
  assert.is_false(ok)
  return err
end

describe("sandbox{}", function()
  it("returns an unstarted app that is a config, creating nothing", function()
    local app = sandbox(options())
    assert.is_true(sandbox.is_config(app))
    assert.is_false(app.started)
    assert.equal(120000, app.options.turnTimeoutMs)
    assert.equal("openai", app.options.provider)
    assert.is_nil(core.fs_stat("/nonexistent/sbx-spec"))
    assert.is_false(sandbox.is_config({}))
  end)

  it("checks names, model, apiKey, prompt and turnTimeoutMs in that order", function()
    assert.equal("sandbox options must be a table", refusal("x"))
    assert.equal("unknown sandbox option: timeZone", refusal(options { timeZone = "UTC", model = "" }))
    assert.equal("model is required", refusal(options { model = " \u{3000}", apiKey = 1 }))
    assert.equal("apiKey must be a function", refusal(options { apiKey = "literal", prompt = 1 }))
    assert.equal("invalid prompt", refusal(options { prompt = "\255", turnTimeoutMs = 1 }))
    assert.equal("turnTimeoutMs must be 1000 to 600000", refusal(options { turnTimeoutMs = 999 }))
    assert.equal("turnTimeoutMs must be 1000 to 600000", refusal(options { turnTimeoutMs = 600001 }))
    assert.equal("turnTimeoutMs must be 1000 to 600000", refusal(options { turnTimeoutMs = "5000" }))
  end)

  it("takes an integral float turnTimeoutMs as the integer (an Integer, spec 1), like the runtime", function()
    local t = sandbox(options { turnTimeoutMs = 5000.0 }).options.turnTimeoutMs
    assert.equal(5000, t)
    assert.equal("integer", math.type(t))
  end)

  it("checks the broker configuration once, at sandbox{}", function()
    assert.equal("invalid broker endpoint URL", refusal(options { modelUrl = "nope" }))
    assert.equal("invalid or duplicate host tool", refusal(options { tools = { { name = "Bad" } } }))
    assert.equal("invalid or duplicate MCP server/tool", refusal(options { mcp = { { name = "Bad", url = "https://m.example/", tools = {} } } }))
  end)
end)

describe("app:broker and app:runtime_options", function()
  it("a broker needs an apiKey under sbx (no host login); with one it serves the configured routes", function()
    local app = sandbox(options())
    local ok, err = pcall(app.broker, app, { channel = "fake:a", speaker = { id = "a", principalId = "p" } })
    assert.is_false(ok)
    assert.equal("apiKey is required when no host login is available", err)
    app = sandbox(options { apiKey = function() return "k" end,
      tools = { { name = "clock", description = "t", parameters = {}, run = function() return "" end } } })
    local b = app:broker { channel = "fake:a", speaker = { id = "a", name = "A", principalId = "p" } }
    assert.same({ "/model", "/tools/clock" }, b:routes())
  end)

  it("hands the runtime the options minus stateFile, initialChannels and provider, with the host's zone", function()
    local calls = {}
    local app = sandbox(options { provider = "anthropic" })
    local opts, checked = app:runtime_options {
      timeZone = "Europe/London", hostLogin = function(p) calls[#calls + 1] = p return "host-key" end,
    }
    assert.is_nil(opts.stateFile)
    assert.is_nil(opts.initialChannels)
    assert.is_nil(opts.provider)
    assert.equal("Europe/London", opts.timeZone)
    assert.equal("host-key", opts.apiKey({ channel = "fake:a" }))
    assert.same({ "anthropic" }, calls)
    assert.equal(app.broker_config, checked)    -- the configuration sandbox{} checked, not a new one
    assert.equal("UTC", (app:runtime_options { hostLogin = function() end }).timeZone)
  end)

  it("an explicit apiKey wins; without one and without a host login it is refused", function()
    local key = function() return "k" end
    assert.equal(key, (sandbox(options { apiKey = key }):runtime_options {}).apiKey)
    local ok, err = pcall(sandbox(options()).runtime_options, sandbox(options()), {})
    assert.is_false(ok)
    assert.equal("apiKey is required when no host login is available", err)
    ok, err = pcall(sandbox(options()).runtime_options, sandbox(options()), "host")
    assert.equal("sandbox host must be a table", err)
  end)

  it("is what a runtime accepts: sandbox.runtime.new(app:runtime_options(host)) constructs", function()
    if not spec_fs.service_account(pending) then return end
    local dir = spec_fs.tmpdir("sb", nil, spec_fs.short_tmp())
    local fake = require "fake_driver"
    local app = sandbox(options { runRoot = dir .. "/run", workspaceRoot = dir .. "/work",
      stateFile = dir .. "/state/c.json", driver = fake.new(fake.reply(true, "x")) })
    local rt = sandbox.runtime.new(app:runtime_options { hostLogin = function() return "k" end })
    assert.equal(dir .. "/run", rt.options.runRoot)
    require("sandbox.async").run(function() rt:dispose() end)
    spec_fs.rmdir(dir)
  end)
end)

describe("the names a host script reaches", function()
  it("sandbox.runtime, broker, delegation, diagnostics and safe fetch", function()
    assert.equal(require "sandbox.runtime", sandbox.runtime)
    assert.equal(require("sandbox.broker").new, sandbox.broker)
    assert.equal(require "sandbox.delegator", sandbox.delegator)
    assert.equal(sandbox.delegator.new, sandbox.scoped_delegator)
    assert.equal(require("sandbox.delegator.research").new, sandbox.research_worker)
    assert.equal(require("sandbox.delegator.scrub").scrub_diagnostic, sandbox.scrub_diagnostic)
    assert.equal(require "sandbox.fetch", sandbox.fetch)
    assert.is_function(sandbox.safe_fetch)
    assert.is_function(sandbox.assert_public_url)
  end)
end)
