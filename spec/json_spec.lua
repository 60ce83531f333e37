-- json_spec.lua: strict JSON in the core (core/json.c, spec/broker.md section 8):
-- what json_decode refuses and accepts, how values are represented on the Lua
-- side, and how json_encode writes them back.
local core = require "sandbox.core"

local decode, encode, null = core.json_decode, core.json_encode, core.json_null

local function refused(s, want)
  local v, err = decode(s)
  assert.is_nil(v)
  assert.are.equal(want or "invalid json", err)
end

local function roundtrip(s)
  local v, err = decode(s)
  assert.is_nil(err)
  assert.is_not_nil(v)
  return encode(v)
end

describe("core.json_decode", function()
  describe("UTF-8", function()
    it("refuses a byte-order mark", function()
      refused("\239\187\191{}")
      refused("\239\187\191\"x\"")
    end)

    it("refuses invalid UTF-8 inside strings", function()
      refused('"\255"')
      refused('"\192\175"')            -- overlong '/'
      refused('"\224\128\175"')        -- overlong 3-byte
      refused('"\240\128\128\175"')    -- overlong 4-byte
      refused('"\237\160\128"')        -- UTF-8 encoded surrogate U+D800
      refused('"\244\144\128\128"')    -- above U+10FFFF
      refused('"\195"')                -- truncated sequence
      refused('"\128"')                -- stray continuation byte
      refused('{"\255":1}')            -- in a member name
    end)

    it("refuses invalid UTF-8 outside strings", function()
      refused("[1,\255]")
    end)

    it("accepts valid multi-byte UTF-8 and keeps its bytes", function()
      assert.are.equal("\195\169\226\130\172\240\159\152\128", decode('"\195\169\226\130\172\240\159\152\128"'))
      assert.are.equal("\244\143\191\191", decode('"\244\143\191\191"'))   -- U+10FFFF
    end)
  end)

  describe("escapes", function()
    it("decodes \\u escapes to UTF-8 and combines surrogate pairs", function()
      assert.are.equal("\195\169", decode('"\\u00e9"'))
      assert.are.equal("\226\130\172", decode('"\\u20AC"'))
      assert.are.equal("\240\159\152\128", decode('"\\ud83d\\ude00"'))
      assert.are.equal("\244\143\191\191", decode('"\\uDBFF\\uDFFF"'))
    end)

    it("decodes the short escapes", function()
      assert.are.equal('"\\/\b\f\n\r\t', decode('"\\"\\\\\\/\\b\\f\\n\\r\\t"'))
    end)

    it("keeps \\u0000 as a NUL byte", function()
      local s = decode('"a\\u0000b"')
      assert.are.equal(3, #s)
      assert.are.equal("a\0b", s)
    end)

    it("refuses an unpaired high surrogate", function()
      refused('"\\ud800"')
      refused('"\\ud800x"')
      refused('"\\ud800\\n"')
      refused('"\\ud800\\u0041"')
      refused('"\\ud800\\ud800"')
    end)

    it("refuses an unpaired low surrogate", function()
      refused('"\\udc00"')
      refused('"a\\udfffb"')
    end)

    it("refuses unknown and truncated escapes", function()
      refused('"\\x41"')
      refused('"\\u12"')
      refused('"\\u12g4"')
      refused('"\\U0041"')
      refused('"\\')
      refused('"\\u00')
    end)

    it("decodes long strings with escapes (longer than the C stack buffer)", function()
      local v = decode('"' .. string.rep("\\u00e9x\\n", 400) .. '"')
      assert.are.equal(string.rep("\195\169x\n", 400), v)
      assert.are.equal(string.rep("\240\159\152\128", 300), decode('"' .. string.rep("\\ud83d\\ude00", 300) .. '"'))
      refused('"' .. string.rep("\\u00e9x", 400) .. '\\q"')
      refused('"' .. string.rep("\\u00e9x", 400) .. '\\u12"')
      refused('"' .. string.rep("\\u00e9x", 400))
    end)

    -- Lua 5.4.4's lua_settop may keep a stale stack pointer when it closes a
    -- to-be-closed slot (a luaL_Buffer box) and the stack moves; failing
    -- long escaped strings at every stack size in fresh coroutines (small
    -- stacks) would corrupt the stack if the decoder left a buffer open.
    it("leaves the Lua stack intact after failing inside a long escaped string", function()
      local bad = '"' .. string.rep("\\u00e9x", 400) .. '\\q"'
      local good = '"' .. string.rep("\\u00e9x", 400) .. '"'
      for depth = 0, 40 do
        for pre = 0, 40 do
          local v = coroutine.wrap(function()
            local t = {}
            for i = 1, pre do t[i] = i end
            local r = { decode(string.rep("[", depth) .. bad .. string.rep("]", depth)) }
            local ok = decode(good)
            local u = { table.unpack(t) }
            return r[1] == nil and r[2] == "invalid json" and #ok == 1200 and #u == pre
          end)()
          assert.is_true(v)
        end
      end
    end)

    it("refuses raw control characters inside strings", function()
      refused('"a\nb"')
      refused('"\t"')
      refused('"\0"')
      refused('"\31"')
      assert.are.equal("\127", decode('"\127"'))
    end)
  end)

  describe("objects", function()
    it("refuses a repeated member name", function()
      refused('{"a":1,"a":2}')
      refused('{"a":1,"b":{},"a":null}')
    end)

    it("with duplicates = \"last\" (rich mode, rich-mode.md 19) the last value wins, the name keeps its place", function()
      local core = require "sandbox.core"
      local v = assert(core.json_decode('{"a":1,"b":2,"\\u0061":{"x":[]}}', nil, { duplicates = "last" }))
      assert.are.equal('{"a":{"x":[]},"b":2}', core.json_encode(v))
      assert.is_nil(core.json_decode('{"a":1,"a":2}', nil, { duplicates = "refuse" }))
      assert.has_error(function() core.json_decode("{}", nil, { duplicates = "first" }) end)
      assert.is_nil(core.json_decode('{"a":1,"a":', nil, { duplicates = "last" }))
    end)

    it("refuses names that are equal only after escape decoding", function()
      refused('{"a":1,"\\u0061":2}')
      refused('{"\\u00e9":1,"\195\169":2}')
    end)

    it("allows the same name in different objects", function()
      local v = decode('{"a":{"a":1},"b":{"a":2}}')
      assert.are.equal(1, v.a.a)
      assert.are.equal(2, v.b.a)
    end)

    it("detects repeats among many members", function()
      local parts = {}
      for i = 1, 5000 do parts[#parts + 1] = ('"k%d":%d'):format(i, i) end
      local ok = "{" .. table.concat(parts, ",") .. "}"
      assert.are.equal(5000, decode(ok).k5000)
      refused("{" .. table.concat(parts, ",") .. ',"k2500":0}')
    end)

    it("records member order in json_order", function()
      local v = decode('{"z":1,"a":2,"m":{"y":1,"b":2}}')
      assert.are.same({ "z", "a", "m" }, core.json_order[v])
      assert.are.same({ "y", "b" }, core.json_order[v.m])
      assert.are.equal(core.json_object_mt, getmetatable(v))
    end)

    it("keeps null members as json_null, never nil", function()
      local v = decode('{"a":null}')
      assert.are.equal(null, v.a)
      assert.are.equal('{"a":null}', encode(v))
    end)

    it("refuses malformed objects", function()
      refused("{")
      refused('{"a"}')
      refused('{"a":}')
      refused('{"a":1,}')
      refused("{a:1}")
      refused("{'a':1}")
      refused('{"a":1 "b":2}')
      refused('{,"a":1}')
      refused('{"a" 1}')
    end)
  end)

  describe("arrays", function()
    it("builds arrays with json_array_mt and elements 1..n", function()
      local v = decode('[1,"x",null,false]')
      assert.are.equal(core.json_array_mt, getmetatable(v))
      assert.are.equal(4, #v)
      assert.are.equal(1, v[1])
      assert.are.equal("x", v[2])
      assert.are.equal(null, v[3])
      assert.are.equal(false, v[4])
    end)

    it("keeps {} and [] distinct", function()
      local o, a = decode("{}"), decode("[]")
      assert.are.equal(core.json_object_mt, getmetatable(o))
      assert.are.equal(core.json_array_mt, getmetatable(a))
      assert.are.equal('{"o":{},"a":[]}', roundtrip('{"o":{},"a":[]}'))
    end)

    it("refuses malformed arrays", function()
      refused("[")
      refused("[1,]")
      refused("[,1]")
      refused("[1 2]")
      refused("]")
    end)
  end)

  describe("depth", function()
    it("accepts 64 nested arrays", function()
      local s = string.rep("[", 64) .. string.rep("]", 64)
      assert.are.equal(s, roundtrip(s))
    end)

    it("refuses 65 nested arrays with 'too deep'", function()
      refused(string.rep("[", 65) .. string.rep("]", 65), "too deep")
    end)

    it("counts objects and arrays alike", function()
      local ok = string.rep('{"a":[', 32) .. "1" .. string.rep("]}", 32)
      assert.is_not_nil(decode(ok))
      refused('[' .. ok .. ']', "too deep")
    end)
  end)

  describe("grammar", function()
    it("refuses trailing garbage", function()
      refused("{} x")
      refused("[1]]")
      refused("1 2")
      refused('"a""b"')
      refused("null\0")
      refused("truex")
    end)

    it("allows only JSON whitespace around the value", function()
      assert.are.equal(1, decode(" \t\r\n1 \t\r\n"))
      refused("\f1")
      refused("1\v")
      refused("\194\160" .. "1")             -- no-break space
    end)

    it("refuses empty input and bare words", function()
      refused("")
      refused("   ")
      refused("nul")
      refused("True")
      refused("undefined")
      refused("NaN")
      refused("Infinity")
      refused("-Infinity")
    end)
  end)

  describe("numbers", function()
    it("refuses numbers outside the JSON grammar", function()
      for _, s in ipairs { "01", "-01", "+1", ".5", "5.", "1.e3", "0x10", "1e", "1e+",
        "-", "--1", "1.5e", "00", "- 1", "1_000", "0.1.2" } do
        refused(s)
      end
    end)

    it("refuses a number that overflows a double", function()
      refused("1e400")
      refused("-1e400")
      refused("[1.8e308]")
      refused("1" .. string.rep("0", 400))
    end)

    it("accepts underflow to zero", function()
      local v = decode("1e-400")
      assert.are.equal("float", math.type(v))
      assert.are.equal(0.0, v)
    end)

    it("decodes integers within 2^53 as Lua integers", function()
      assert.are.equal(math.tointeger(2 ^ 53), decode("9007199254740992"))
      assert.are.equal("integer", math.type(decode("9007199254740992")))
      assert.are.equal("integer", math.type(decode("-9007199254740992")))
      assert.are.equal("integer", math.type(decode("0")))
      assert.are.equal(123456789, decode("123456789"))
    end)

    it("decodes big integers and anything with a fraction or exponent as floats", function()
      local v = decode("9007199254740993")
      assert.are.equal("float", math.type(v))
      assert.are.equal(2 ^ 53, v)
      assert.are.equal("float", math.type(decode("123456789012345678901234567890")))
      assert.are.equal(1.2345678901234568e29, decode("123456789012345678901234567890"))
      assert.are.equal("float", math.type(decode("1.0")))
      assert.are.equal("float", math.type(decode("1e2")))
      assert.are.equal(100.0, decode("1E+2"))
      assert.are.equal(0.015, decode("1.5e-2"))
    end)

    it("keeps the value of numbers through re-encoding", function()
      assert.are.equal("[0.1,2.5,-3,1e+300,9007199254740992,1.2345678901234568e+29]",
        roundtrip("[0.1,2.5,-3,1e300,9007199254740992,123456789012345678901234567890]"))
      assert.are.equal("0.30000000000000004", roundtrip("0.30000000000000004"))
      assert.are.equal("4.94065645841247e-324", roundtrip("4.9406564584124654e-324"))
      assert.are.equal("1.7976931348623157e+308", roundtrip("1.7976931348623157e308"))
    end)

    it("keeps negative zero reasonably", function()
      local v = decode("-0.0")
      assert.are.equal("-0", encode(v))
      assert.are.equal("-0", roundtrip("-0"))
      assert.are.equal(1 / 0 * -1, 1 / decode("-0"))
    end)
  end)

  describe("reflection filter", function()
    local f = core.reflect_filter("real-model-key")

    it("refuses a string holding the key", function()
      local v, err = decode('{"token":"real-model-key"}', f)
      assert.is_nil(v)
      assert.are.equal("reflection", err)
    end)

    it("catches an escaped echo after decoding", function()
      local v, err = decode('{"t":"real\\u002dmodel\\u002dkey"}', f)
      assert.is_nil(v)
      assert.are.equal("reflection", err)
    end)

    it("catches the key as a member name", function()
      assert.are.same({ nil, "reflection" }, { decode('{"real-model-key":1}', f) })
      assert.are.same({ nil, "reflection" }, { decode('{"a":{"x-real-model-key-y":null}}', f) })
    end)

    it("passes values without the key", function()
      local v = decode('{"t":"real-model-ke","n":12345,"b":true,"z":null}', f)
      assert.are.equal("real-model-ke", v.t)
    end)

    it("still reports malformed input as invalid", function()
      assert.are.same({ nil, "invalid json" }, { decode('{"t":1', f) })
    end)
  end)
end)

describe("core.json_encode", function()
  it("writes objects in received order", function()
    local s = '{"z":1,"a":[3,2,1],"m":{"y":true,"b":null},"c":"x"}'
    assert.are.equal(s, roundtrip(s))
  end)

  it("skips removed members and appends new ones in sorted order", function()
    local v = decode('{"z":1,"a":2,"m":3}')
    v.a = nil
    v.q = "q"
    v.b = "b"
    assert.are.equal('{"z":1,"m":3,"b":"b","q":"q"}', encode(v))
  end)

  it("writes each name once even if json_order lists it twice", function()
    local v = decode('{"a":1,"b":2}')
    core.json_order[v] = { "b", "a", "b" }
    assert.are.equal('{"b":2,"a":1}', encode(v))
  end)

  it("encodes plain tables: sequences as arrays, others as sorted objects", function()
    assert.are.equal("[1,2,3]", encode({ 1, 2, 3 }))
    assert.are.equal("{}", encode({}))
    assert.are.equal('{"a":1,"b":{"c":[true]}}', encode({ b = { c = { true } }, a = 1 }))
    assert.are.same({ nil, "invalid value" }, { encode({ [1] = 1, [3] = 3 }) })
    assert.are.same({ nil, "invalid value" }, { encode({ 1, 2, x = 3 }) })
  end)

  it("refuses non-string keys in objects", function()
    local v = decode('{"a":1}')
    v[1] = 2
    assert.are.same({ nil, "invalid value" }, { encode(v) })
  end)

  it("refuses values JSON cannot hold", function()
    assert.are.same({ nil, "invalid value" }, { encode(0 / 0) })
    assert.are.same({ nil, "invalid value" }, { encode(1 / 0) })
    assert.are.same({ nil, "invalid value" }, { encode(-1 / 0) })
    assert.are.same({ nil, "invalid value" }, { encode(print) })
    assert.are.same({ nil, "invalid value" }, { encode(nil) })
    assert.are.same({ nil, "invalid value" }, { encode({ f = print }) })
    assert.are.same({ nil, "invalid value" }, { encode(io.stdout) })
  end)

  it("refuses invalid UTF-8", function()
    assert.are.same({ nil, "invalid utf-8" }, { encode("\255") })
    assert.are.same({ nil, "invalid utf-8" }, { encode({ ["\237\160\128"] = 1 }) })
  end)

  it("escapes quotes, backslashes and controls but not '/'", function()
    assert.are.equal([["a\"b\\c/d"]], encode('a"b\\c/d'))
    assert.are.equal([["\b\f\n\r\t\u0000\u0001\u001f"]], encode("\b\f\n\r\t\0\1\31"))
    assert.are.equal('"\127\195\169"', encode("\127\195\169"))
  end)

  it("writes integral floats as integers and others in shortest form", function()
    assert.are.equal("1", encode(1.0))
    assert.are.equal("-42", encode(-42.0))
    assert.are.equal("9007199254740992", encode(2.0 ^ 53))
    assert.are.equal("18014398509481984", encode(2.0 ^ 54))
    assert.are.equal("1e+300", encode(1e300))
    assert.are.equal("0.1", encode(0.1))
    assert.are.equal("0.3333333333333333", encode(1 / 3))
    assert.are.equal("9223372036854775807", encode(math.maxinteger))
    assert.are.equal("true", encode(true))
    assert.are.equal("null", encode(null))
  end)

  it("stops at max_bytes with 'too large'", function()
    local v = decode('{"a":"0123456789"}')
    local s = encode(v)
    assert.are.equal(18, #s)
    assert.are.equal(s, encode(v, 18))
    assert.are.same({ nil, "too large" }, { encode(v, 17) })
    assert.are.same({ nil, "too large" }, { encode(string.rep("x", 2000000), 1048576) })
    assert.are.equal(1048576, #encode(string.rep("x", 1048574), 1048576))
  end)

  it("refuses nesting deeper than 64 and cycles with 'too deep'", function()
    local t = {}
    for _ = 1, 64 do t = { t } end
    assert.are.same({ nil, "too deep" }, { encode(t) })
    assert.are.equal(string.rep("[", 63) .. "{}" .. string.rep("]", 63), encode(t[1]))
    local c = {}
    c.self = c
    assert.are.same({ nil, "too deep" }, { encode(c) })
  end)

  it("re-encodes a decoded document byte for byte", function()
    local s = '{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"h\\u00e9 \\"/\\\\\\n","tool_calls":[]},"logprobs":null}],"usage":{"prompt_tokens":10,"total":1.5e-7}}'
    assert.are.equal('{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"h\195\169 \\"/\\\\\\n","tool_calls":[]},"logprobs":null}],"usage":{"prompt_tokens":10,"total":1.5e-07}}', roundtrip(s))
  end)
end)

describe("core.utf8_valid", function()
  it("accepts strict UTF-8", function()
    assert.is_true(core.utf8_valid(""))
    assert.is_true(core.utf8_valid("plain ascii"))
    assert.is_true(core.utf8_valid("\195\169\226\130\172\240\159\152\128\244\143\191\191"))
  end)

  it("refuses overlongs, surrogates, out-of-range and truncated sequences", function()
    assert.is_false(core.utf8_valid("\192\128"))
    assert.is_false(core.utf8_valid("\193\191"))
    assert.is_false(core.utf8_valid("\224\159\191"))
    assert.is_false(core.utf8_valid("\237\160\128"))
    assert.is_false(core.utf8_valid("\237\191\191"))
    assert.is_false(core.utf8_valid("\244\144\128\128"))
    assert.is_false(core.utf8_valid("\245\128\128\128"))
    assert.is_false(core.utf8_valid("abc\226\130"))
    assert.is_false(core.utf8_valid("\255"))
  end)
end)

-- lua/sandbox/json.lua: the Lua face every module uses (the engine included).
describe("sandbox.json", function()
  local sj = require "sandbox.json"

  it("object keeps the order of names and leaves nil values out; array stays an array when empty", function()
    assert.equal('{"b":1,"a":2}', sj.encode(sj.object({ "b", "x", "a" }, { a = 2, b = 1 })))
    assert.equal("[]", sj.encode(sj.array()))
    assert.equal("array", sj.kind(sj.array()))
    assert.equal("object", sj.kind(sj.object({}, {})))
  end)

  it("kind, keys and count read decoded values and plain tables alike", function()
    local v = sj.decode('{"z":1,"a":[],"m":null}')
    assert.same({ "z", "a", "m" }, sj.keys(v))
    assert.equal(3, sj.count(v))
    assert.equal("null", sj.kind(v.m))
    assert.equal("array", sj.kind({ 1, 2 }))
    assert.equal("object", sj.kind({ a = 1 }))
    assert.is_nil(sj.kind(function() end))
    assert.same({ "a", "b" }, sj.keys({ b = 1, a = 2 }))
  end)

  it("plain turns decoded JSON into plain tables, null members left out", function()
    local p = sj.plain(sj.decode('{"a":null,"b":[1,null,{"c":null}],"d":"x"}'))
    assert.is_nil(getmetatable(p))
    assert.is_nil(p.a)
    assert.equal("x", p.d)
    assert.same({ 1, nil, {} }, p.b)
    assert.is_nil(sj.plain(sj.null))
  end)

  it("jsonable makes any Lua value encodable: functions left out, nil and non-finite as null", function()
    assert.equal('{"a":[1,null,"s"],"n":null}',
      sj.encode(sj.jsonable({ a = { 1, 0 / 0, "s" }, f = print, n = math.huge, [3] = "int key dropped" })))
    assert.is_nil(sj.jsonable(print))
    assert.equal(sj.null, sj.jsonable(nil))
    assert.equal(sj.null, sj.value(print))
    assert.equal(sj.null, sj.value(nil))
    assert.equal(7, sj.value(7))
  end)

  it("jsonable keeps an ordered object's order and puts its other members after, sorted", function()
    local o = sj.object({ "z", "a" }, { z = 1, a = 2 })
    o.m, o.b = 3, 4
    assert.equal('{"z":1,"a":2,"b":4,"m":3}', sj.encode(sj.jsonable(o)))
  end)

  it("bounds the recursion at 64 levels, which also ends a cycle", function()
    local t = {}
    t.self = t
    local j, depth = sj.jsonable(t), 0
    while j.self do j, depth = j.self, depth + 1 end
    assert.equal(64, depth)
    local p = sj.decode(string.rep("[", 64) .. string.rep("]", 64))
    assert.is_table(sj.plain(p))
  end)
end)
