-- crypto_spec.lua: the OpenSSL helpers of core/crypto.c against published
-- vectors (FIPS 180-2 for SHA-256, RFC 4648 section 10 for base64).
local core = require "sandbox.core"

describe("core.sha256_hex", function()
  it("matches the FIPS 180-2 vectors", function()
    assert.are.equal("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", core.sha256_hex(""))
    assert.are.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", core.sha256_hex("abc"))
    assert.are.equal("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
      core.sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))
    assert.are.equal("cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
      core.sha256_hex(string.rep("a", 1000000)))
  end)

  it("hashes embedded NUL bytes", function()
    assert.are.equal("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d", core.sha256_hex("\0"))
  end)

  it("raises on a non-string argument", function()
    assert.has_error(function() core.sha256_hex({}) end)
  end)
end)

describe("core.base64 and core.base64url", function()
  it("match the RFC 4648 vectors", function()
    local vectors = { [""] = "", f = "Zg==", fo = "Zm8=", foo = "Zm9v", foob = "Zm9vYg==",
      fooba = "Zm9vYmE=", foobar = "Zm9vYmFy" }
    for input, want in pairs(vectors) do
      assert.are.equal(want, core.base64(input))
      assert.are.equal((want:gsub("=", "")), core.base64url(input))
    end
  end)

  it("use the url-safe alphabet without padding for base64url", function()
    assert.are.equal("+/+/Pz4=", core.base64("\251\255\191?>"))
    assert.are.equal("-_-_Pz4", core.base64url("\251\255\191?>"))
    assert.are.equal("///+", core.base64("\255\255\254"))
    assert.are.equal("___-", core.base64url("\255\255\254"))
  end)

  it("encode long input without line breaks", function()
    local s = core.base64(string.rep("\0", 3000))
    assert.are.equal(4000, #s)
    assert.are.equal(string.rep("A", 4000), s)
  end)
end)

describe("core.base64_decode", function()
  it("inverts core.base64 on every length and byte", function()
    local all = {}
    for i = 0, 255 do all[#all + 1] = string.char(i) end
    all = table.concat(all)
    for n = 0, 64 do
      local s = all:sub(1, n)
      assert.equal(s, core.base64_decode(core.base64(s)))
    end
    local big = string.rep(all, 40000)   -- ~10 MiB: several decode chunks
    assert.equal(big, core.base64_decode(core.base64(big)))
  end)

  it("refuses what is not strict standard base64", function()
    for _, bad in ipairs { "a", "abc", "ab=c", "A===", "Zm9v\n", "Zm9v YmFy", "Zm9-", "Zm9_", "====", "Zg=a" } do
      local v, err = core.base64_decode(bad)
      assert.is_nil(v, bad)
      assert.equal("invalid base64", err)
    end
  end)
end)

describe("core.hex", function()
  it("writes lowercase hex of every byte", function()
    assert.are.equal("", core.hex(""))
    assert.are.equal("0001abff7f", core.hex("\0\1\171\255\127"))
    assert.are.equal("7265616c2d6d6f64656c2d6b6579", core.hex("real-model-key"))
  end)
end)

describe("core.random_hex", function()
  it("returns 2*n lowercase hex digits, different each time", function()
    local a, b = core.random_hex(16), core.random_hex(16)
    assert.are.equal(32, #a)
    assert.is_truthy(a:match("^[0-9a-f]+$"))
    assert.are_not.equal(a, b)
    assert.are.equal(2, #core.random_hex(1))
    assert.are.equal(128, #core.random_hex(64))
  end)

  it("refuses sizes outside 1..64", function()
    assert.has_error(function() core.random_hex(0) end)
    assert.has_error(function() core.random_hex(65) end)
    assert.has_error(function() core.random_hex("x") end)
  end)
end)
