-- log_spec.lua: the one operator logger (spec/operations.md 2, "Behaviours
-- the specs must cover" 3): text and JSON lines that parse back, quoting
-- that round-trips, the journald priority prefix (JOURNAL_STREAM naming
-- stderr, checked on a real child process), logLevel, a `logger` table as
-- the destination, and the option checks of sandbox{}.
local json = require "sandbox.json"
local log = require "sandbox.log"
local sandbox = require "sandbox"
local C = require "log_capture"
local spec_fs = require "spec_fs"

local function capture(format, level)
  local lines = {}
  local logger = log.new { format = format, level = level or "debug", journal = false,
    write = function(l) lines[#lines + 1] = l end }
  return logger, lines
end

describe("the text format", function()
  it("writes time, level, message and the fields, channel and turn first", function()
    local logger, lines = capture("text")
    logger:warn("turn finished", { reason = "upstream_status", turn = "3f2a", channel = "discord:1",
      status = 401, fix = "check the credential apiKey returns for this channel", ms = 12 })
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ warn turn finished channel=discord:1 turn=3f2a "
      .. "status=401 reason=upstream_status fix=\"check the credential apiKey returns for this channel\" ms=12$", lines[1])
  end)

  it("quotes and escapes values so every one round-trips", function()
    local values = { "plain", "", "two words", 'say "hi"', "back\\slash", "new\nline", "tab\there", "cr\r",
      "bell\7", "ünïcödé", "a=b", "x\"=y z", "-", 'fix="set outputTokensField = \\"max\\""', 42, true }
    local logger, lines = capture("text")
    for i, v in ipairs(values) do logger:info("event", { channel = "c:1", turn = "t", value = v, n = i }) end
    for i, v in ipairs(values) do
      local p = C.parse_text(lines[i])
      assert.equal(tostring(v), p.fields.value, lines[i])
      assert.equal(tostring(i), p.fields.n)
      assert.equal("event", p.msg)
      assert.is_nil(lines[i]:find("\n", 1, true))
    end
  end)

  it("keeps a message on its one line", function()
    local logger, lines = capture("text")
    logger:error("two\nlines", {})
    assert.equal(1, #lines)
    assert.matches(" error two lines$", lines[1])
  end)
end)

describe("the json format", function()
  it("writes one object per line: time, level, msg, then the fields, numbers as numbers", function()
    local logger, lines = capture("json")
    logger:info("broker call", { channel = "discord:1", turn = "ab", route = "/model", status = 200, ms = 812,
      fix = 'set modelAuth = "api-key"' })
    local v = assert(json.decode(lines[1]))
    assert.same({ "time", "level", "msg", "channel", "turn", "route", "status", "fix", "ms" },
      require("sandbox.core").json_order[v])
    assert.equal("info", v.level)
    assert.equal("broker call", v.msg)
    assert.equal(200, v.status)
    assert.equal('set modelAuth = "api-key"', v.fix)
    assert.matches("Z$", v.time)
  end)
end)

describe("journald (JOURNAL_STREAM)", function()
  it("prefixes the syslog priority and drops the time, in both formats", function()
    for _, format in ipairs { "text", "json" } do
      local lines = {}
      local logger = log.new { format = format, level = "debug", journal = true, write = function(l) lines[#lines + 1] = l end }
      logger:error("e", { channel = "c:1" })
      logger:warn("w", {})
      logger:info("i", {})
      logger:debug("d", {})
      assert.equal(4, #lines)
      for i, p in ipairs { "<3>", "<4>", "<6>", "<7>" } do
        assert.equal(p, lines[i]:sub(1, 3), lines[i])
        assert.is_nil(lines[i]:find("%d%d%d%d%-%d%d%-%d%dT"), lines[i])
      end
      if format == "json" then
        local v = assert(json.decode(lines[1]:sub(4)))
        assert.is_nil(v.time)
        assert.equal("error", v.level)
      else
        assert.equal("<3>error e channel=c:1", lines[1])
      end
    end
  end)

  it("is detected when JOURNAL_STREAM names the device and inode of stderr (a real child process)", function()
    local dir = spec_fs.tmpdir("log-spec")
    local script = dir .. "/j.lua"
    spec_fs.write(script, [[
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local log = require "sandbox.log"
log.new { level = "info" }:warn("turn finished", { channel = "c:1", turn = "t" })
]])
    local err = dir .. "/stderr"
    -- the device and inode of the file stderr goes to: what systemd sets
    local cmd = string.format("touch %s; JOURNAL_STREAM=$(stat -c '%%d:%%i' %s) lua5.4 -e 'package.cpath=\"%s\"' %s 2>>%s",
      spec_fs.q(err), spec_fs.q(err), package.cpath:match("^[^;]+"), spec_fs.q(script), spec_fs.q(err))
    os.execute(cmd)
    assert.equal("<4>warn turn finished channel=c:1 turn=t\n", spec_fs.read(err))
    os.execute(string.format("JOURNAL_STREAM=1:2 lua5.4 -e 'package.cpath=\"%s\"' %s 2>%s",
      package.cpath:match("^[^;]+"), spec_fs.q(script), spec_fs.q(err)))
    assert.matches("^%d%d%d%d%-.-Z warn turn finished", spec_fs.read(err))
    spec_fs.rmdir(dir, "log-spec")
  end)
end)

describe("logLevel and destinations", function()
  it("drops lines under the level (info by default)", function()
    local lines = {}
    local logger = log.new { journal = false, write = function(l) lines[#lines + 1] = l end }
    logger:debug("turn started", {})
    logger:info("turn finished", {})
    assert.equal(1, #lines)
    local warn_only = log.new { level = "warn", journal = false, write = function(l) lines[#lines + 1] = l end }
    warn_only:info("x", {})
    warn_only:error("y", {})
    assert.equal(2, #lines)
  end)

  it("hands (message, fields) to a logger table instead of stderr; debug is optional", function()
    local got = {}
    local logger = log.new { level = "debug", logger = {
      info = function(m, f) got[#got + 1] = { "info", m, f } end,
      warn = function(m, f) got[#got + 1] = { "warn", m, f } end,
      error = function() error("a host logger that raises loses its line only") end,
    } }
    logger:debug("turn started", { turn = "t" })
    logger:info("turn finished", { turn = "t", ms = 3 })
    logger:error("x", {})
    logger:warn("broker refused", { reason = "method" })
    assert.same({ { "info", "turn finished", { turn = "t", ms = 3 } }, { "warn", "broker refused", { reason = "method" } } }, got)
  end)
end)

describe("the options (sandbox{} and sandbox.runtime{})", function()
  local base = { image = "i", runRoot = "/r", workspaceRoot = "/w", stateFile = "/s/c.json", model = "m",
    modelUrl = "https://m.example/v1", apiKey = function() return "k" end }
  local function build(over)
    local o = {}
    for k, v in pairs(base) do o[k] = v end
    for k, v in pairs(over) do o[k] = v end
    local ok, err = pcall(sandbox, o)
    return ok and "ok" or err
  end

  it("accept logFormat, logLevel and logger, refusing other values with their strings", function()
    assert.equal("ok", build { logFormat = "json", logLevel = "debug" })
    assert.equal('logFormat must be "text" or "json"', build { logFormat = "xml" })
    assert.equal('logLevel must be "debug", "info", "warn" or "error"', build { logLevel = "trace" })
    assert.equal("ok", build { logger = { info = print, warn = print, error = print } })
    assert.equal("logger must be a table of functions {debug?, info, warn, error}", build { logger = print })
    assert.equal("logger must be a table of functions {debug?, info, warn, error}", build { logger = { info = print } })
    assert.equal("logger must be a table of functions {debug?, info, warn, error}",
      build { logger = { info = print, warn = print, error = print, trace = print } })
  end)
end)
