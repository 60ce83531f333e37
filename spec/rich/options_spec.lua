-- rich/options_spec.lua: sandbox.rich's construction checks in the order of
-- spec/rich-mode.md section 3 (behaviours 1-7), and the channel directory
-- rules of section 4 (behaviours 9-10) on a real partyDir.
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local options = require "sandbox.rich._options"
local channel = require "sandbox.rich._channel"
local spec_fs = require "spec_fs"

local dirs = {}
teardown(function() spec_fs.rmdirs(dirs) end)

local function party()
  return spec_fs.tmpdir("rich-opt", dirs, spec_fs.short_tmp()) .. "/party"
end

local function base(over)
  local o = {
    partyDir = party(), image = "pi-roundtable-sandbox:pi",
    profiles = { main = { model = "claude-sonnet-4-6" } },
    oauthToken = function() return "tok" end, effort = { judge = function() return "low" end },
    driver = {},
  }
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

local function refusal(o, host)
  local ok, err = pcall(options.resolve, o, host)
  assert.is_false(ok, "expected a refusal")
  return err
end

describe("rich construction checks (3)", function()
  it("B1: refuses a relative partyDir and / with the dedicated-directory message", function()
    assert.equal("Dedicated absolute state directory required", refusal(base { partyDir = "party" }))
    assert.equal("Dedicated absolute state directory required", refusal(base { partyDir = "/" }))
    assert.equal("Dedicated absolute state directory required", refusal(base { partyDir = "//" }))
  end)

  it("step 2: without a driver, a host that is not Linux is refused", function()
    local o = base()
    o.driver = nil
    assert.equal("Pi sandbox requires native Linux and local Docker", refusal(o, { linux = false }))
  end)

  it("B2: a root host process (uid or gid 0) is refused", function()
    assert.equal("Pi sandbox host must be non-root", refusal(base(), { uid = 0, gid = 1000 }))
    assert.equal("Pi sandbox host must be non-root", refusal(base(), { uid = 1000, gid = 0 }))
  end)

  it("step 4: containerPrefix must match its pattern", function()
    for _, bad in ipairs { "Roundtable", "-x", "a_b", string.rep("a", 42), "" } do
      assert.equal("Invalid container prefix", refusal(base { containerPrefix = bad }))
    end
  end)

  it("B3: deadlines outside 1,000-600,000 ms are refused", function()
    for _, v in ipairs { 999, 600001, 1500.5, "1000", -1 } do
      assert.equal("Invalid runtime deadline", refusal(base { turnTimeoutMs = v }))
      assert.equal("Invalid runtime deadline", refusal(base { startTimeoutMs = v }))
    end
    assert.is_table(options.resolve(base { turnTimeoutMs = 1000, startTimeoutMs = 600000 }))
  end)

  it("B4: a compactor timeout above half the turn is refused, the default too", function()
    local c = { engine = "e", compact = function() end }
    assert.equal("The compactor's timeout must leave half the turn",
      refusal(base { turnTimeoutMs = 10000, compaction = { engine = "e", compact = c.compact, timeoutMs = 6000 } }))
    -- default max(1000, min(120000, floor(1500/3))) = 1000 > 750
    assert.equal("The compactor's timeout must leave half the turn", refusal(base { turnTimeoutMs = 1500, compaction = c }))
    assert.equal(3333, options.resolve(base { turnTimeoutMs = 10000, compaction = c }).compaction.timeoutMs)
    -- without a compactor the shortest turn is fine
    assert.is_table(options.resolve(base { turnTimeoutMs = 1000 }))
  end)

  it("B6: an http or credentialed upstream, or an http MCP URL without allowHttpMcp, is refused", function()
    for _, url in ipairs { "http://api.anthropic.com", "https://user:pw@api.anthropic.com", "https://a@api.anthropic.com",
        "https://api.anthropic.com/?x=1", "https://api.anthropic.com/#f", "ftp://x", "https://" } do
      assert.equal("Invalid trusted endpoint", refusal(base { upstream = url }))
    end
    local mcp = { servers = { { name = "s", url = "http://127.0.0.1:1/mcp", tools = {} } } }
    assert.equal("Invalid trusted endpoint", refusal(base { mcp = mcp }))
    assert.equal("http://127.0.0.1:1/mcp", options.resolve(base { mcp = mcp, allowHttpMcp = true }).mcp.servers[1].url)
    assert.equal("https://api.example.com/base", options.resolve(base { upstream = "https://api.example.com/base/" }).upstream)
  end)

  it("B7: maxCalls, maxOutputTokens, the compactor and timeZone each have their own message", function()
    for _, v in ipairs { 0, 1001, 2.5 } do assert.equal("Invalid broker budget", refusal(base { maxCalls = v })) end
    for _, v in ipairs { 1024, 200001 } do assert.equal("Invalid output-token budget", refusal(base { maxOutputTokens = v })) end
    local f = function() end
    for _, c in ipairs {
      { engine = "bad name", compact = f }, { engine = "e", compact = "no" },
      { engine = "e", compact = f, timeoutMs = 999 }, { engine = "e", compact = f, maxRequestBytes = 0 },
      { engine = "e", compact = f, maxRequestBytes = 96 * 1024 * 1024 + 1 },
    } do
      assert.equal("Invalid compactor", refusal(base { compaction = c }))
    end
    assert.equal("Invalid time zone", refusal(base { timeZone = "Mars/Olympus" }))
    assert.equal("Invalid time zone", refusal(base { timeZone = "../etc/passwd" }))
    assert.equal("Europe/Berlin", options.resolve(base { timeZone = "Europe/Berlin" }).timeZone)
  end)

  it("issue 26: upstreamRetries is the sealed mode's 0-5 check, default 2, and reaches the broker", function()
    for _, v in ipairs { -1, 6, 2.5, "2" } do
      assert.equal(errors.UPSTREAM_RETRIES, refusal(base { upstreamRetries = v }))
    end
    assert.equal(2, options.resolve(base()).upstreamRetries)
    assert.equal(0, options.resolve(base { upstreamRetries = 0 }).upstreamRetries)
    assert.equal(5, options.resolve_broker { model = "claude-sonnet-4-6", oauthToken = function() return "t" end,
      upstreamRetries = 5 }.upstreamRetries)
  end)

  it("step 7: MCP server names and host tool names have their patterns", function()
    local function server(name) return { servers = { { name = name, url = "https://m.example/mcp", tools = {} } } } end
    assert.equal("Invalid MCP server name", refusal(base { mcp = server("bad name") }))
    assert.equal("Invalid MCP server name", refusal(base { mcp = { servers = {
      { name = "a", url = "https://m.example/mcp" }, { name = "a", url = "https://m.example/mcp" } } } }))
    local call = function() end
    assert.equal("Invalid host tool name", refusal(base { tools = { names = { "ok", "ok" }, call = call } }))
    assert.equal("Invalid host tool name", refusal(base { tools = { names = { "sh ell" }, call = call } }))
    assert.equal("Invalid host tool name", refusal(base { tools = { names = { string.rep("a", 129) }, call = call } }))
  end)

  it("runs the checks in the page's order: the earliest failing step wins", function()
    local o = base { partyDir = "rel", containerPrefix = "BAD", turnTimeoutMs = 1, maxCalls = 0, timeZone = "x" }
    assert.equal("Dedicated absolute state directory required", refusal(o))
    o.partyDir = party()
    assert.equal("Pi sandbox host must be non-root", refusal(o, { uid = 0, gid = 0 }))
    assert.equal("Invalid container prefix", refusal(o))
    o.containerPrefix = nil
    assert.equal("Invalid runtime deadline", refusal(o))
    o.turnTimeoutMs = nil
    assert.equal("Invalid broker budget", refusal(o))
    o.maxCalls = nil
    assert.equal("Invalid time zone", refusal(o))
  end)

  it("B5: a partyDir with group/other bits or a foreign owner is refused; a fresh one is made 0700", function()
    local dir = party()
    local o = options.resolve(base { partyDir = dir })
    assert.equal(dir, o.partyDir)
    assert.equal(tonumber("700", 8), core.fs_stat(dir).mode)
    os.execute("chmod 750 " .. spec_fs.q(dir))
    assert.equal("State directory must be private and host-owned", refusal(base { partyDir = dir }))
    os.execute("chmod 700 " .. spec_fs.q(dir))
    local uid = core.getuid()
    assert.equal("State directory must be private and host-owned", refusal(base { partyDir = dir }, { uid = uid + 1 }))
  end)

  it("refuses a configuration without its required options before touching partyDir", function()
    local dir = party()
    local o = base { partyDir = dir }
    o.profiles = nil
    assert.equal("Invalid Pi sandbox option: profiles", refusal(o))
    assert.is_nil(core.fs_lstat(dir))
    o = base { partyDir = dir }
    o.oauthToken = "secret"
    assert.equal("Invalid Pi sandbox option: oauthToken", refusal(o))
    o = base { partyDir = dir, effort = {} }
    assert.equal("Invalid Pi sandbox option: effort.judge", refusal(o))
  end)

  it("defaults: the page's values", function()
    local o = options.resolve(base())
    assert.equal("https://api.anthropic.com", o.upstream)
    assert.equal("UTC", o.timeZone)
    assert.equal("roundtable-sandbox", o.containerPrefix)
    assert.equal("roundtable.sandbox.channel", o.labelChannel)
    assert.equal("roundtable.sandbox.profile", o.labelProfile)
    assert.same({ 90000, 600000, 128, 128000 }, { o.startTimeoutMs, o.turnTimeoutMs, o.maxCalls, o.maxOutputTokens })
    assert.equal("private", o.memory.visibility)
    assert.equal("pi-roundtable-sandbox:pi", o.workerImage)
  end)
end)

describe("rich channel directories (4)", function()
  it("segments: every code point outside [A-Za-z0-9_-] becomes _", function()
    assert.equal("discord_a_b", channel.segment("discord:a:b"))
    assert.equal("discord_a_b", channel.segment("discord:a_b"))
    assert.equal("caf__x", channel.segment("café x"))
    assert.equal("Ab-9_", channel.segment("Ab-9_"))
  end)

  it("B10: a key over 256 characters, a symlinked root and a socket path over 100 are refused", function()
    assert.has_error(function() channel.segment(string.rep("é", 257)) end, "Channel key too long")
    assert.equal(string.rep("_", 256), channel.segment(string.rep("é", 256)))
    local dir = spec_fs.tmpdir("rich-ch", dirs, spec_fs.short_tmp())
    local target = dir .. "/elsewhere"
    core.fs_mkdir(target)
    assert(core.fs_mkdir(dir .. "/party"))
    os.execute("ln -s " .. spec_fs.q(target) .. " " .. spec_fs.q(dir .. "/party/discord_x"))
    local p = channel.paths(dir .. "/party", "discord:x")
    assert.has_error(function() channel.guard(p, "discord:x") end, "Channel root symlink refused")
    assert.is_nil(core.fs_lstat(target .. "/.channel-key"))
    local long = channel.paths(dir .. "/party", string.rep("a", 100))
    assert.has_error(function() channel.guard(long, string.rep("a", 100)) end, "Broker socket path too long")
  end)

  it("B9: discord:a:b then discord:a_b is an alias refusal, and the first keeps its workspace", function()
    local dir = spec_fs.tmpdir("rich-ch", dirs, spec_fs.short_tmp())
    local p = channel.paths(dir, "discord:a:b")
    channel.guard(p, "discord:a:b")
    channel.prepare(p)
    assert.equal("discord:a:b", spec_fs.read(p.key_file))
    assert.equal(tonumber("600", 8), core.fs_stat(p.key_file).mode)
    local q = channel.paths(dir, "discord:a_b")
    assert.equal(p.root, q.root)
    assert.has_error(function() channel.guard(q, "discord:a_b") end, "Channel workspace alias refused")
    channel.guard(p, "discord:a:b")                 -- the owner still passes
    assert.equal("dir", core.fs_lstat(p.workspace).type)
    -- a planted link or an over-long key file fails closed too
    os.remove(p.key_file)
    os.execute("ln -s /etc/hostname " .. spec_fs.q(p.key_file))
    assert.has_error(function() channel.guard(p, "discord:a:b") end, "Channel workspace alias refused")
  end)

  it("ownDirectory replaces a planted link by a real directory and leaves its target alone", function()
    local dir = spec_fs.tmpdir("rich-ch", dirs, spec_fs.short_tmp())
    core.fs_mkdir(dir .. "/target")
    os.execute("ln -s " .. spec_fs.q(dir .. "/target") .. " " .. spec_fs.q(dir .. "/att"))
    channel.own_directory(dir .. "/att")
    assert.equal("dir", core.fs_lstat(dir .. "/att").type)
    assert.same({}, core.fs_readdir(dir .. "/target"))
  end)
end)
