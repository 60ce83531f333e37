-- write_file_new_spec.lua: core.write_file_new (core/atomic_file.c), the
-- exclusive, no-follow creation behind rich mode's .channel-key record
-- (spec/rich-mode.md 4, alias guard step 2), and the no-follow reread.
local core = require "sandbox.core"
local spec_fs = require "spec_fs"

describe("core.write_file_new", function()
  local dir
  before_each(function() dir = spec_fs.tmpdir("wfn") end)
  after_each(function() spec_fs.rmdir(dir, "wfn") end)

  it("creates the file 0600 with every byte, and refuses anything already there with EEXIST", function()
    local p = dir .. "/.channel-key"
    assert.is_true(core.write_file_new(p, "discord:a:b"))
    assert.equal("discord:a:b", spec_fs.read(p))
    assert.equal(tonumber("600", 8), core.fs_stat(p).mode)
    local ok, msg, code = core.write_file_new(p, "discord:a_b")
    assert.is_nil(ok)
    assert.equal("EEXIST", code)
    assert.matches("^EEXIST: ", msg)
    assert.equal("discord:a:b", spec_fs.read(p))
  end)

  it("never follows a planted link, dangling or not", function()
    local target = dir .. "/target"
    os.execute("ln -s " .. spec_fs.q(target) .. " " .. spec_fs.q(dir .. "/dangling"))
    local ok, _, code = core.write_file_new(dir .. "/dangling", "x")
    assert.is_nil(ok)
    assert.equal("EEXIST", code)
    assert.is_nil(core.fs_lstat(target))
    assert.is_true(core.write_file_new(dir .. "/m", "y", tonumber("640", 8)))
    assert.equal(tonumber("640", 8), core.fs_stat(dir .. "/m").mode & tonumber("777", 8) | 0)
    local _, _, c2 = core.read_file_nofollow(dir .. "/dangling", 1025)
    assert.equal("ELOOP", c2)
  end)
end)
