-- docker/provider_turns_spec.lua: a real sealed turn per provider family of
-- spec/providers.md ("Behaviours the specs must cover" 7): the real worker
-- image (built from this build under a test tag), the CLI driver, the
-- runtime and its broker, against that family's loopback server written
-- from the provider's API reference (spec/fixtures/provider_upstream.mjs).
-- The cases and their options are spec/support/provider_turns.lua's, shared
-- with the container-less spec/provider_turns_spec.lua. Opt-in with
-- SANDBOX_DOCKER_TEST=1; runs as the sbx account.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local fake_upstream = require "fake_upstream"
local probe_images = require "probe_images"
local spec_fs = require "spec_fs"
local P = require "provider_turns"

local ENABLED = os.getenv("SANDBOX_DOCKER_TEST") == "1"
local IMAGE = "sbx-provider-spec-worker:" .. core.random_hex(4)
local BUILD = package.cpath:match("(build[%w%-]*)/lua/%?%.so") or "build"
local q = spec_fs.q
local function sh(cmd) return spec_fs.run(cmd .. " 2>&1") end

if not ENABLED then
  describe("a sealed turn per provider family on real Docker", function()
    pending("set SANDBOX_DOCKER_TEST=1 to run the real-Docker specs (make check does)")
  end)
  return
end

describe("a sealed turn per provider family on real Docker", function()
  local root

  setup(function()
    assert.is_not.equal(0, (core.getuid()), "run the Docker specs as the non-root sbx account")
    root = spec_fs.tmpdir("sb-prov")
    local out, rc = sh("SBX_IMAGE=" .. IMAGE .. " SBX_IMAGE_CONTEXT=" .. q(root .. "/ctx") .. " bash worker/image.sh " .. BUILD)
    assert.equal(0, rc, "make image recipe failed: " .. out)
  end)

  teardown(function()
    probe_images.remove_containers_of(IMAGE)
    sh("docker image rm -f " .. q(IMAGE))
    if root then spec_fs.rmdir(root, "sb-prov") end
  end)

  for i, case in ipairs(P.FAMILIES) do
    it(case.name .. ": the guest gets the family's answer in a fresh container; the container is gone", function()
      local up = fake_upstream.start_provider(case.name, P.KEY)
      finally(function() up:stop() end)
      local dir = root .. "/t" .. i
      os.execute("mkdir -m 700 " .. q(dir))
      local rt = P.runtime(dir, case, up, false, { image = IMAGE })
      local res, reqs = async.run(function()
        up:reset()
        local r = rt:run_turn("fake:" .. case.name, P.GUEST, "What time is it?")
        local log = up:log()
        rt:dispose()
        return r, log
      end)
      assert.equal("ok", res.reason, tostring(res.error) .. " " .. tostring(res.fix))
      assert.equal(case.text, res.text)
      case.check(reqs, json)
      for _, r in ipairs(reqs) do assert.is_nil(r.body:find(P.KEY, 1, true), "the key is never in a body") end
      assert.equal("", sh("docker ps -aq --filter label=roundtable.sandbox.installation=" .. rt.installation))
    end)
  end
end)
