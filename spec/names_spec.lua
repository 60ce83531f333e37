-- names_spec.lua: the broker's name rules and endpoint URL rule
-- (lua/sandbox/broker/_names.lua; spec/broker.md sections 1 and 4).
local names = require "sandbox.broker._names"

describe("name rules (broker.md 1)", function()
  it("tool, server and MCP tool names: ^[a-z][a-z0-9_]{0,47}$", function()
    for _, ok in ipairs { "a", "clock", "get_time2", string.rep("a", 48) } do
      assert.is_true(names.tool_name(ok), ok)
    end
    for _, bad in ipairs { "", "A", "1a", "_a", "a-b", "a.b", "a b", "é", string.rep("a", 49), 7 } do
      assert.is_false(names.tool_name(bad), tostring(bad))
    end
  end)

  it("function names in a /model request allow 64", function()
    assert.is_true(names.function_name(string.rep("f", 64)))
    assert.is_false(names.function_name(string.rep("f", 65)))
    assert.is_false(names.function_name("host-x"))
  end)

  it("call ids are 1-128 code points of valid UTF-8", function()
    assert.is_true(names.call_id("c"))
    assert.is_true(names.call_id(string.rep("é", 128)))
    assert.is_false(names.call_id(string.rep("é", 129)))
    assert.is_false(names.call_id(""))
    assert.is_false(names.call_id("\255"))
    assert.is_false(names.call_id(1))
  end)
end)

describe("endpoint URLs (broker.md 4)", function()
  local INVALID, UNSAFE = "invalid broker endpoint URL", "broker endpoints must be credential-free HTTPS URLs"
  local function check(url, allow_http)
    local ok, err = names.check_endpoint(url, allow_http)
    return ok and "ok" or err
  end

  it("accepts https with a host, a port, a path and a query", function()
    assert.equal("ok", check("https://models.example/v1/chat/completions"))
    assert.equal("ok", check("https://models.example:8443/v1?api-version=2"))
    assert.equal("ok", check("https://[2001:db8::1]:443/x"))
    assert.equal("ok", check("HTTPS://127.0.0.1/"))
  end)

  it("refuses what does not parse as invalid", function()
    for _, bad in ipairs { "", "models.example", "https:/x", "https://", "https://exa mple/",
      "https://a%41/", "https://h:99999/", "https://h:123456/", "https://ex\tample/", "https://é.example/",
      string.rep("a", 2049), 42 } do
      assert.equal(INVALID, check(bad), tostring(bad))
    end
  end)

  it("refuses http (unless allowHttp), credentials and a fragment as unsafe", function()
    assert.equal(UNSAFE, check("http://127.0.0.1:8080/v1"))
    assert.equal("ok", check("http://127.0.0.1:8080/v1", true))
    assert.equal(UNSAFE, check("ftp://h/", true))
    assert.equal(UNSAFE, check("https://user:pw@h/"))
    assert.equal(UNSAFE, check("https://user@h/"))
    assert.equal(UNSAFE, check("https://h/#frag"))
  end)
end)
