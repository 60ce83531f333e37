-- reflect_spec.lua: the credential reflection filter (core/reflect.c,
-- spec/broker.md section 12): each of the six forms of the key is caught as a
-- byte substring, near misses are not, and value walks skip numbers, booleans
-- and null. The key "k/+=y?>" has reserved characters, so its URI form differs
-- from the raw key and its base64 and base64url forms really differ.
local core = require "sandbox.core"

local KEY = "k/+=y?>"
local FORMS = {
  raw = "k/+=y?>",
  uri = "k%2F%2B%3Dy%3F%3E",
  base64 = "ay8rPXk/Pg==",
  base64url = "ay8rPXk_Pg",
  hex = "6b2f2b3d793f3e",
  HEX = "6B2F2B3D793F3E",
}

-- Reference needles built in Lua from the crypto helpers, for random keys.
local function uri_encode(s)
  return (s:gsub("[^%w%-_%.!~%*'%(%)]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local function needles(key)
  return { key, uri_encode(key), core.base64(key), core.base64url(key), core.hex(key), core.hex(key):upper() }
end

local function reference_hit(list, s)
  for _, n in ipairs(list) do
    if s:find(n, 1, true) then return true end
  end
  return false
end

local function random_bytes(n, alphabet)
  local t = {}
  for i = 1, n do
    if alphabet then
      local j = math.random(#alphabet)
      t[i] = alphabet:sub(j, j)
    else
      t[i] = string.char(math.random(0, 255))
    end
  end
  return table.concat(t)
end

describe("core.reflect_filter", function()
  local f = core.reflect_filter(KEY)

  it("catches each of the six forms, alone and inside text", function()
    for name, form in pairs(FORMS) do
      assert.is_true(f:hit(form), name)
      assert.is_true(f:hit("prefix " .. form .. " suffix"), name)
      assert.is_true(f:hit(string.rep("x", 100) .. form), name)
      assert.is_true(f:hit(form .. string.rep("x", 100)), name)
    end
  end)

  it("does not catch near misses", function()
    for name, form in pairs(FORMS) do
      assert.is_false(f:hit(form:sub(1, -2)), name)
      assert.is_false(f:hit(form:sub(2)), name)
    end
    assert.is_false(f:hit("k%2f%2b%3dy%3f%3e"))     -- lowercase percent escapes: out of scope
    assert.is_false(f:hit("ay8rPXk/Pg"))            -- base64 without its padding
    assert.is_false(f:hit("6b2F2b3d793f3e"))        -- mixed-case hex
    assert.is_false(f:hit(""))
    assert.is_false(f:hit(string.rep("k/+=y?", 1000)))
  end)

  it("catches base64url with trailing padding (it contains the needle)", function()
    assert.is_true(f:hit("ay8rPXk_Pg=="))
  end)

  it("walks values: strings, member names, nested arrays", function()
    assert.is_true(f:hit_value(FORMS.uri))
    assert.is_true(f:hit_value({ a = { b = { "x", FORMS.HEX } } }))
    assert.is_true(f:hit_value({ [FORMS.base64] = 1 }))
    assert.is_true(f:hit_value(core.json_decode('{"x":[{"' .. FORMS.base64url .. '":null}]}')))
    assert.is_false(f:hit_value(core.json_decode('{"x":[{"y":null}],"z":"k/+=y"}')))
  end)

  it("never counts numbers, booleans or null", function()
    local nf = core.reflect_filter("12345")
    assert.is_false(nf:hit_value(12345))
    assert.is_false(nf:hit_value(12345.0))
    assert.is_false(nf:hit_value({ 12345, [12345] = 12345 }))
    assert.is_true(nf:hit_value("12345"))
    local bf = core.reflect_filter("true")
    assert.is_false(bf:hit_value(true))
    assert.is_false(bf:hit_value({ true, false }))
    local zf = core.reflect_filter("null")
    assert.is_false(zf:hit_value(core.json_null))
    assert.is_false(zf:hit_value(core.json_decode("[null,null,true,1e5]")))
  end)

  it("counts a walk deeper than 64 levels as a hit (fails closed)", function()
    local t = "x"
    for _ = 1, 64 do t = { t } end
    assert.is_false(f:hit_value(t))
    assert.is_true(f:hit_value({ t }))
    local c = {}
    c[1] = c
    assert.is_true(f:hit_value(c))
  end)

  it("refuses an empty key and one over 4096 bytes", function()
    assert.are.same({ nil, "invalid key length" }, { core.reflect_filter("") })
    assert.are.same({ nil, "invalid key length" }, { core.reflect_filter(string.rep("k", 4097)) })
    local big = core.reflect_filter(string.rep("k", 4096))
    assert.is_true(big:hit(core.hex(string.rep("k", 4096))))
    assert.has_error(function() core.reflect_filter(nil) end)
    assert.has_error(function() f.hit({}, "x") end)
  end)

  it("works for one- and two-byte keys", function()
    local one = core.reflect_filter("\0")
    assert.is_true(one:hit("a\0b"))
    assert.is_true(one:hit("%00"))
    assert.is_true(one:hit("AA=="))
    assert.is_false(one:hit("abc0"))
    local two = core.reflect_filter("ab")
    assert.is_true(two:hit(string.rep("x", 200) .. "6162"))
    assert.is_false(two:hit(string.rep("a", 200)))
  end)

  it("finds a needle after a prefix that matches needle ends everywhere", function()
    -- Such a prefix exhausts the verification budget and the rest goes to memmem.
    local long = core.reflect_filter("aaaaaaaaXaaaaaaaa")      -- skipping scan
    local short = core.reflect_filter("aXa")                    -- SSE2 scan
    local pad = string.rep("a", 1048576)
    assert.is_false(long:hit(pad))
    assert.is_true(long:hit(pad .. "aaaaaaaaXaaaaaaaa"))
    assert.is_true(long:hit(pad .. core.hex("aaaaaaaaXaaaaaaaa") .. "a"))
    assert.is_false(short:hit(pad))
    assert.is_true(short:hit(pad .. "Xa"))
    assert.is_true(short:hit(pad .. "YVhh"))
  end)

  it("agrees with a plain substring search on random keys and haystacks", function()
    math.randomseed(1234)
    local alphabet = "ab/+=%_-0123456789ABCDEFabcdefYWJ"
    for round = 1, 400 do
      local key = random_bytes(math.random(1, 12), round % 2 == 0 and alphabet or nil)
      local list = needles(key)
      local flt = core.reflect_filter(key)
      for _ = 1, 10 do
        local len = math.random(0, 200)
        local hay = random_bytes(len, alphabet)
        if math.random() < 0.5 then
          local n = list[math.random(#list)]
          local at = math.random(0, #hay)
          hay = hay:sub(1, at) .. n .. hay:sub(at + 1)
          if math.random() < 0.5 then hay = hay:sub(1, -2) end   -- sometimes cut the tail
        end
        assert.are.equal(reference_hit(list, hay), flt:hit(hay))
      end
    end
  end)
end)

describe("core.json_decode with a filter", function()
  local f = core.reflect_filter("real-model-key")

  it("catches every form of the key, escaped echoes and member names", function()
    local cases = {
      '{"token":"real-model-key"}',
      '{"t":"real\\u002dmodel\\u002dkey"}',
      '{"t":"\\u0072eal-model-key"}',
      '{"t":"' .. core.base64("real-model-key") .. '"}',
      '{"t":"' .. core.base64url("real-model-key") .. '"}',
      '{"t":"' .. core.hex("real-model-key") .. '"}',
      '{"t":"' .. core.hex("real-model-key"):upper() .. '"}',
      '{"real-model-key":1}',
      '["x",["y",{"z":"Bearer real-model-key"}]]',
    }
    for _, s in ipairs(cases) do
      local v, err = core.json_decode(s, f)
      assert.is_nil(v, s)
      assert.are.equal("reflection", err, s)
    end
  end)

  it("never counts numbers, booleans or null", function()
    local nf = core.reflect_filter("123")
    local v = core.json_decode('{"a":123,"b":[true,null,1230]}', core.reflect_filter("true"))
    assert.is_not_nil(v)
    assert.is_not_nil(core.json_decode('[123,1.23e5,-123]', nf))
    assert.are.same({ nil, "reflection" }, { core.json_decode('["123"]', nf) })
  end)

  it("counts only matches inside a decoded string, not in syntax or across strings", function()
    local f = core.reflect_filter("1,2")
    assert.is_not_nil(core.json_decode('[1,2]', f))
    assert.is_not_nil(core.json_decode('{"a":"x1","b":"2"}', core.reflect_filter('x1","b')))
    assert.are.same({ nil, "reflection" }, { core.json_decode('[1,2,"x1,2y"]', f) })
    assert.are.same({ nil, "reflection" }, { core.json_decode('[1,2,"x1\\u002c2y"]', f) })
    assert.are.same({ nil, "reflection" }, { core.json_decode('{"1,2":true}', f) })
  end)
end)
