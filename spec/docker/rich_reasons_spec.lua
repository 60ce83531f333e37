-- docker/rich_reasons_spec.lua: a rich turn that fails on the real daemon
-- names its reason and fix like a sealed turn (docs/operations.md 3-6, issue
-- 21 item 6): the built-in Engine API driver asked to create a container of
-- an image the daemon does not have gives image_missing with this tree's
-- build command, in the `turn finished` line and sbx_turns_total{mode="rich"}.
-- Opt-in with SANDBOX_DOCKER_TEST=1, as the service account. Nothing is
-- created: the daemon refuses the create.
local async = require "sandbox.async"
local rich = require "sandbox.rich"
local spec_fs = require "spec_fs"

if os.getenv("SANDBOX_DOCKER_TEST") ~= "1" then
  describe("rich turn reasons on real Docker", function()
    pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker cases")
  end)
  return
end

describe("rich turn reasons on real Docker", function()
  local dirs = {}
  teardown(function() spec_fs.rmdirs(dirs) end)

  it("an image the daemon does not have is image_missing with `make image-pi`, logged and counted", function()
    local lines = {}
    local function at(level) return function(msg, fields) lines[#lines + 1] = { level = level, msg = msg, fields = fields } end end
    local missing = "pi-roundtable-sandbox:no-such-tag-" .. spec_fs.sh("echo $PPID")
    local rt = rich {
      partyDir = spec_fs.tmpdir("rrd", dirs, spec_fs.short_tmp()) .. "/p", image = missing,
      profiles = { main = { model = "claude-sonnet-4-6" } }, oauthToken = function() return "host-token" end,
      effort = { judge = function() return "low" end },
      logger = { info = at("info"), warn = at("warn"), error = at("error") }, startTimeoutMs = 5000,
    }
    local r
    async.run(function()
      r = rt:runTurn { channel = "discord:h21", profile = "main", turnId = "t-missing",
        author = { id = "1", name = "Ann" }, text = "hi", images = {} }
      rt:stopBrokers()
    end)
    assert.is_false(r.ok)
    local fin
    for _, l in ipairs(lines) do if l.msg == "turn finished" then fin = l end end
    assert.equal("warn", fin.level)
    assert.same({ "discord:h21", "t-missing", "image_missing" }, { fin.fields.channel, fin.fields.turn, fin.fields.reason })
    assert.matches("^build it: make .*image%-pi$", fin.fields.fix)
    local text = rt:metrics()
    assert.truthy(text:find('\nsbx_turns_total{mode="rich",reason="image_missing"} 1\n', 1, true))
    assert.truthy(text:find('\nsbx_turns_total{mode="rich",reason="worker_failed"} 0\n', 1, true))
  end)
end)
