-- channel_key_spec.lua: the channel key grammar and workspace segment
-- (lua/sandbox/channels/_key.lua; spec/runtime.md 7.1, 7.5).
local channel_key = require "sandbox.channels._key"
local core = require "sandbox.core"

describe("channel keys (7.1)", function()
  it("accept ^[a-z][a-z0-9_-]*:.+ of valid UTF-8 up to 256 characters", function()
    for _, ok in ipairs { "discord:123", "fake:guests", "a:b", "x_y-z9:any thing/at all",
      "demo:" .. string.rep("é", 251) } do
      assert.is_true(channel_key.valid(ok), ok)
    end
  end)

  it("refuse everything else", function()
    for _, bad in ipairs { "", "discord", "discord:", ":x", "Discord:1", "9a:1", "a.b:1", "a b:1",
      "demo:" .. string.rep("é", 252), "demo:a\nb", "demo:a\0b", "demo:\127", "demo:a\u{2028}",
      "demo:a\u{2029}", "demo:\255", 7, nil } do
      assert.is_false(channel_key.valid(bad), tostring(bad))
    end
  end)

  it("name the workspace by the lowercase hex SHA-256 of the key (7.5), never by the key", function()
    local seg = channel_key.segment("discord:../../etc")
    assert.equal(core.sha256_hex("discord:../../etc"), seg)
    assert.matches("^[0-9a-f]+$", seg)
    assert.equal(64, #seg)
    assert.equal("invalid sandbox channel", channel_key.E_INVALID)
  end)
end)
