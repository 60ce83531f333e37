-- reflect_stream_spec.lua: core.reflect_stream, the bounded reflection
-- stream of spec/rich-mode.md 11.5 (behaviours 72-74 and 80 at the core's
-- level; the fuzzer fuzz/reflect_stream_fuzz.c checks every split point).
local core = require "sandbox.core"

local KEY = "sk-ant-oat01-host-secret+/="

-- Pushes chunks; returns the bytes emitted (finish included) or nil, err and
-- the index of the failing chunk.
local function run(s, chunks)
  local out = {}
  for i, c in ipairs(chunks) do
    local e, err = s:push(c)
    if not e then return nil, err, i end
    out[#out + 1] = e
  end
  out[#out + 1] = assert(s:finish())
  return table.concat(out)
end

local function forms(key)
  local uri = key:gsub("[^%w%-_%.!~%*'%(%)]", function(c) return ("%%%02X"):format(c:byte()) end)
  return { key, uri, core.base64(key), core.base64url(key), core.hex(key), core.hex(key):upper() }
end

describe("core.reflect_stream (rich-mode.md 11.5)", function()
  it("carries the longest form minus one", function()
    local s = core.reflect_stream(KEY)
    local longest = 0
    for _, f in ipairs(forms(KEY)) do longest = math.max(longest, #f) end
    assert.are.equal(longest - 1, s:carry())
  end)

  it("emits the data minus the carry on each chunk and the rest at the end", function()
    local s = core.reflect_stream(KEY)
    local carry = s:carry()
    local a = ("a"):rep(100)
    assert.are.equal(a:sub(1, 100 - carry), s:push(a))
    assert.are.equal("", s:push(""))
    assert.are.equal(a:sub(100 - carry + 1), s:finish())
    assert.are.equal(100, s:total())
  end)

  it("passes a clean stream through unchanged, however it is cut", function()
    local body = ('event: message\ndata: {"x":"' .. ("y"):rep(30) .. '"}\n\n'):rep(50)
    for _, size in ipairs({ 1, 7, 23, 24, 100, #body }) do
      local chunks = {}
      for i = 1, #body, size do chunks[#chunks + 1] = body:sub(i, i + size - 1) end
      assert.are.equal(body, run(core.reflect_stream(KEY), chunks))
    end
  end)

  it("catches a token split across two chunks, at every split point (item 73)", function()
    for _, form in ipairs(forms(KEY)) do
      local body = "data: " .. form .. " tail"
      for cut = 1, #body - 1 do
        local out, err = run(core.reflect_stream(KEY), { body:sub(1, cut), body:sub(cut + 1) })
        assert.is_nil(out)
        assert.are.equal("reflected", err)
      end
    end
  end)

  it("catches the URL-encoded, base64, base64url and both hex forms (item 74)", function()
    for i, form in ipairs(forms(KEY)) do
      local out, err, at = run(core.reflect_stream(KEY), { "x", "prefix " .. form, "more" })
      assert.is_nil(out, "form " .. i)
      assert.are.equal("reflected", err)
      assert.are.equal(2, at)
    end
  end)

  it("fails too large once the total passes the cap (item 80), and stays failed", function()
    local s = core.reflect_stream(KEY, 10)
    assert.is_truthy(s:push("12345"))
    assert.is_truthy(s:push("67890"))
    local out, err = s:push("x")
    assert.is_nil(out)
    assert.are.equal("too large", err)
    assert.are.same({ nil, "too large" }, { s:push("y") })
    assert.are.same({ nil, "too large" }, { s:finish() })
    assert.are.equal(core.limits.STREAM_MAX_RESPONSE_BYTES, 50 * 1024 * 1024)
  end)

  it("takes a filter object too, and refuses a bad key like reflect_filter", function()
    local s = core.reflect_stream(assert(core.reflect_filter(KEY)))
    assert.are.same({ nil, "reflected" }, { s:push(KEY) })
    assert.are.same({ nil, "invalid key length" }, { core.reflect_stream("") })
    assert.has_error(function() core.reflect_stream({}) end)
    local done = core.reflect_stream(KEY)
    done:finish()
    assert.has_error(function() done:push("x") end, "reflection stream already finished")
  end)
end)
