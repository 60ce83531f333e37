-- bun_options_spec.lua: the Bun bridge's option file is generated from the
-- one Lua declaration of rich mode's options (issue 21 item 6): regenerating
-- it gives exactly the committed bun/src/options.generated.ts, and the
-- generated names are the ones sandbox.rich{} and the embedding read.
local core = require "sandbox.core"
local option_table = require "sandbox.rich._option_table"
local options = require "sandbox.rich._options"
local spec_fs = require "spec_fs"

local GENERATED = "bun/src/options.generated.ts"

describe("the generated Bun option file", function()
  it("regenerating it from lua/sandbox/rich/_option_table.lua gives the committed file byte for byte", function()
    local dir = assert(core.fs_mkdtemp((os.getenv("TMPDIR") or "/tmp") .. "/bunopt-XXXXXX"))
    local out = dir .. "/options.generated.ts"
    local ok = os.execute("lua5.4 scripts/gen_bun_options.lua " .. spec_fs.q(out))
    local fresh = spec_fs.read(out)
    core.fs_rmtree(dir)
    assert.is_true(ok)
    assert.equal(fresh, spec_fs.read(GENERATED), "run `make` to regenerate " .. GENERATED)
  end)

  it("lists every plain option sandbox.rich{} declares, and every name it takes, once", function()
    local text = assert(spec_fs.read(GENERATED))
    local plain = text:match("RICH_PLAIN_OPTIONS = %[(.-)%]")
    local names = text:match("RICH_OPTION_NAMES = %[(.-)%]")
    local got_plain, got_names = {}, {}
    for n in plain:gmatch('"([^"]+)"') do got_plain[#got_plain + 1] = n end
    for n in names:gmatch('"([^"]+)"') do got_names[#got_names + 1] = n end
    assert.same(options.PLAIN, got_plain)
    local all = {}
    for _, o in ipairs(option_table.TABLE) do all[#all + 1] = o[1] end
    assert.same(all, got_names)
    for _, n in ipairs(options.PLAIN) do
      assert.truthy(text:find("\n  " .. n .. "%??: "), n)   -- typed in the interface
    end
  end)

  it("lists the sealed mode's JSON options from its one declaration, which sandbox{} and sandbox.runtime{} read", function()
    local sealed = require "sandbox.runtime._option_table"
    local text = assert(spec_fs.read(GENERATED))
    local got = {}
    for n in text:match("SANDBOX_JSON_OPTIONS = %[(.-)%]"):gmatch('"([^"]+)"') do got[#got + 1] = n end
    assert.same(sealed.SANDBOX_PLAIN, got)
    assert.equal(sealed.SANDBOX, require("sandbox").OPTIONS)
    assert.equal(sealed.RUNTIME, require("sandbox.runtime._options").OPTIONS)
    assert.is_nil(sealed.SANDBOX.timeZone)       -- sandbox{} takes the host's zone
    assert.is_true(sealed.RUNTIME.timeZone)
    assert.is_nil(sealed.RUNTIME.stateFile)      -- the channel store is sandbox{}'s
  end)

  it("sandbox.rich{} refuses a name outside the declaration with the page's message", function()
    assert.equal("partydir", options.unknown_name { partydir = "/x", image = "i" })
    assert.is_nil(options.unknown_name { partyDir = "/x", image = "i", oauthToken = print })
    local ok, err = pcall(options.resolve, { partyDir = "/nonexistent-h21", image = "i", bogus = 1 })
    assert.is_false(ok)
    assert.equal("Invalid Pi sandbox option: bogus", err)
  end)
end)
