-- json_shape_spec.lua: bounded, shape-first decoding of request bodies
-- (core/json_shape.c, json.decode_body; issue 21 item 2): the text is scanned
-- against the route's shape and a memory budget before anything is built,
-- unknown members are refused while scanning, dropped members are never
-- decoded, and what is accepted decodes exactly as the full decoder would.
local core = require "sandbox.core"
local json = require "sandbox.json"

local bounded, cost = core.json_decode_bounded, core.json_cost
local BIG = 1 << 40

local function dec(s, shape, budget, dup)
  return bounded(s, { budget = budget or BIG, shape = shape, duplicates = dup or "last" })
end

-- The same value, member order and kinds included, as the full decoder's.
local function same_as_full(s, shape)
  local v, why = dec(s, shape)
  assert.is_nil(why)
  assert.equal(json.encode(core.json_decode(s, nil, { duplicates = "last" })), json.encode(v))
end

local VALID = {
  '{}', '[]', '"x"', '0', '-0', '1.5e3', '12345678901234567890', '-9007199254740993', 'true', 'null',
  '{"b":1,"a":[{},[],{"c":null}],"z":"\\u00e9\\ud83d\\ude00\\n"}',
  '  {"a" : [ 1 , 2 ] , "b" : { "c" : "d" } }  ',
  '{"a":1,"a":2,"b":3}',
  '"' .. ("x\\n"):rep(400) .. '"',
  '[' .. ("[]"):rep(3, ",") .. ']',
  '{"\\u0069nput":{"k":[1,2,3]}}',
}

local INVALID = {
  '', ' ', '{', '{"a"}', '{"a":}', '[1,]', '{"a":1,}', '01', '1.', '.5', '1e', '-', 'tru', 'nul',
  '"\\x"', '"\\ud800"', '"\\udc00"', '"\\ud800\\u0041"', '"a\1"', '"\255"', '"\237\160\128"',
  '1e999', '-1e400', '{} x', '\239\187\191{}', '[1 2]', '{"a":1 "b":2}', '"unterminated',
  ("1"):rep(400) .. "e999",
}

describe("core.json_decode_bounded", function()
  it("decodes every valid document exactly as the full decoder does", function()
    for _, s in ipairs(VALID) do same_as_full(s) end
  end)

  it("refuses every document the full decoder refuses", function()
    for _, s in ipairs(INVALID) do
      assert.is_nil(core.json_decode(s, nil, { duplicates = "last" }), s)
      local v, why = dec(s)
      assert.is_nil(v, s)
      assert.equal("invalid json", why, s)
    end
  end)

  it("refuses nesting deeper than 64 levels, also inside a dropped member", function()
    local ok64 = ("["):rep(64) .. ("]"):rep(64)
    same_as_full(ok64)
    assert.equal("too deep", select(2, dec(("["):rep(65) .. ("]"):rep(65))))
    local shape = { unknown = "drop", members = { a = true } }
    assert.equal("too deep", select(2, dec('{"junk":' .. ("["):rep(64) .. ("]"):rep(64) .. '}', shape)))
    assert.is_not_nil(dec('{"junk":' .. ("["):rep(63) .. ("]"):rep(63) .. '}', shape))
  end)

  it("refuses a repeated member when duplicates are refused, also on an object built member by member", function()
    assert.equal("invalid json", select(2, dec('{"a":1,"a":2}', nil, BIG, "refuse")))
    assert.equal("invalid json", select(2, dec('{"a":1,"a":2}', { unknown = "drop", members = { a = true } }, BIG, "refuse")))
    local v = dec('{"a":1,"x":0,"a":2}', { unknown = "drop", members = { a = true } })
    assert.equal(2, v.a)
    assert.same({ "a" }, json.keys(v))
  end)

  describe("shapes", function()
    local RESULT = { members = { turnId = true, result = { members = {
      ok = true, text = true, files = { max = 2, items = { members = { name = true, data = true } } } } } } }

    it("refuses an unknown member while scanning, naming where, before reading what follows", function()
      -- the text after the unknown member is not even valid JSON: the scan
      -- stops at the member, so the reason is the member, not the syntax
      local v, why, path = dec('{"turnId":"t1","junk":[{},{},' .. ("{"):rep(10), RESULT)
      assert.is_nil(v)
      assert.equal("unknown member", why)
      assert.equal("$.junk", path)
      v, why, path = dec('{"result":{"ok":true,"files":[{"name":"a","data":"b","mode":1}]}}', RESULT)
      assert.equal("unknown member", why)
      assert.equal("$.result.files[0].mode", path)
    end)

    it("matches member names after escape decoding", function()
      local v = dec('{"turn\\u0049d":"t1"}', RESULT)
      assert.equal("t1", v.turnId)
      assert.equal("unknown member", select(2, dec('{"turn\\u0069d":"t1"}', RESULT)))
    end)

    it("refuses an array past its shape's max", function()
      local v, why, path = dec('{"result":{"files":[{},{},{}]}}', RESULT)
      assert.is_nil(v)
      assert.equal("too many items", why)
      assert.equal("$.result.files[2]", path)
      assert.is_not_nil(dec('{"result":{"files":[{},{}]}}', RESULT))
    end)

    it("leaves a value of another kind to the route (no refusal of its own)", function()
      same_as_full('{"turnId":5,"result":"x"}', RESULT)
      same_as_full('[{"junk":1}]', RESULT)
      same_as_full('{"result":{"files":{"any":1}}}', RESULT)
    end)

    it("keeps the full decoder's value for an accepted body", function()
      same_as_full('{"turnId":"t1","result":{"ok":true,"text":"x","files":[{"name":"a","data":"QQ=="}]},"turnId":"t2"}', RESULT)
    end)

    it("drops an unknown member unread: never decoded, never counted, and the kept members keep their order", function()
      local shape = { unknown = "drop", members = { messages = true, max_tokens = true } }
      local junk = "[" .. ("{},"):rep(200000) .. "{}]"
      local s = '{"max_tokens":5,"metadata":' .. junk .. ',"messages":[{"role":"user","content":"hi"}],"model":"x"}'
      -- the whole body would cost far more than 4 KiB; what is kept does not
      assert.is_true(cost(s) > 1000000)
      local v, why = dec(s, shape, 4096)
      assert.is_nil(why)
      assert.same({ "max_tokens", "messages" }, json.keys(v))
      assert.equal("hi", v.messages[1].content)
      assert.is_nil(v.metadata)
      assert.equal('{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}', json.encode(v))
    end)

    it("drops down arrays with an items shape, through a shape that refers to itself, and counts none of it", function()
      local BLOCK = { unknown = "drop", members = { type = true, text = true } }
      BLOCK.members.content = { items = BLOCK }
      local shape = { unknown = "drop", members = { messages = { items = { unknown = "drop", members = { content = { items = BLOCK } } } } } }
      local junk = "[" .. ("{},"):rep(100000) .. "{}]"
      local s = '{"messages":[{"junk":' .. junk .. ',"content":[{"type":"text","cite":' .. junk .. ',"text":"a"},'
        .. '{"type":"x","content":[{"text":"b","more":' .. junk .. '}]},"plain"]}]}'
      local v, why = dec(s, shape, 8192)
      assert.is_nil(why)
      assert.equal('{"messages":[{"content":[{"type":"text","text":"a"},{"type":"x","content":[{"text":"b"}]},"plain"]}]}', json.encode(v))
      assert.is_true(json.is_array(v.messages[1].content))
    end)

    it("below a refusing or keeping object a dropping shape is not honoured: the subtree is decoded and counted whole", function()
      local shape = { members = { k = { unknown = "drop", members = { a = true } } }, unknown = "keep" }
      local s = '{"k":{"a":1,"b":[{},{}]},"z":1}'
      same_as_full(s, shape)
      assert.equal(cost(s), cost(s, shape))
    end)

    it("still validates a dropped member strictly", function()
      local shape = { unknown = "drop", members = { a = true } }
      for _, bad in ipairs { '"\255"', '1e999', '[1,]', '"\\ud800"' } do
        assert.equal("invalid json", select(2, dec('{"a":1,"x":' .. bad .. '}', shape)), bad)
      end
    end)

    it("drops members of nested dropping objects and keeps a kept subtree whole", function()
      local shape = { unknown = "drop", members = { a = { unknown = "drop", members = { b = true } }, k = true } }
      local v = dec('{"a":{"b":{"z":1},"c":2},"k":{"x":{}},"d":3}', shape)
      assert.equal('{"a":{"b":{"z":1}},"k":{"x":{}}}', json.encode(v))
    end)
  end)

  it("scans every kept string with a reflection filter; a dropped member is never read", function()
    local f = core.reflect_filter("sk-secret-key")
    local shape = { unknown = "drop", members = { a = true } }
    local v, why = bounded('{"a":"x sk-secret-key y"}', { budget = BIG, shape = shape, filter = f })
    assert.is_nil(v)
    assert.equal("reflection", why)
    v = bounded('{"a":"fine","junk":"sk-secret-key"}', { budget = BIG, shape = shape, filter = f })
    assert.equal("fine", v.a)
  end)

  it("json_shape_check runs the scan alone and names where it stops", function()
    assert.is_true(core.json_shape_check('{"a":[1]}', { members = { a = true } }))
    local ok, why, path = core.json_shape_check('{"a":{"b":[{"c":1}]}}', { members = { a = { members = { b = { items = { members = {} } } } } } })
    assert.is_nil(ok)
    assert.equal("unknown member", why)
    assert.equal("$.a.b[0].c", path)
    assert.equal("too large", select(2, core.json_shape_check('[{},{}]', {}, 100)))
  end)

  describe("the budget", function()
    it("refuses a body whose decode would pass it, for every worst shape, before building anything", function()
      for _, el in ipairs { "{}", "[]", '"a"', "0", '{"a":{}}', ("["):rep(30) .. ("]"):rep(30) } do
        local s = "[" .. (el .. ","):rep(100000) .. el .. "]"
        local v, why = dec(s, nil, 3 * #s)
        assert.is_nil(v, el)
        assert.equal("too large", why, el)
      end
    end)

    it("counts at least what the full decoder really allocates, for each shape", function()
      for _, el in ipairs { "{}", "[]", '"a"', "1", '{"a":1}', '"' .. ("x"):rep(1000) .. '"', '"' .. ("\\n"):rep(600) .. '"',
                             '{"' .. ("n"):rep(300) .. '":[]}' } do
        local s = "[" .. (el .. ","):rep(20000) .. el .. "]"
        collectgarbage()
        collectgarbage("stop")
        local before = collectgarbage("count")
        local v = core.json_decode(s)
        local used = (collectgarbage("count") - before) * 1024
        collectgarbage("restart")
        assert.is_not_nil(v)
        assert.is_true(cost(s) >= used, ("%s: estimated %d < allocated %d"):format(el:sub(1, 20), cost(s), used))
      end
    end)

    it("passes a body of long strings at a fraction of the budget (what real conversations are made of)", function()
      local msg = '{"role":"user","content":"' .. ("lorem ipsum "):rep(200) .. '"}'
      local s = '{"messages":[' .. (msg .. ","):rep(2000) .. msg .. ']}'
      assert.is_true(cost(s) < 1.5 * #s)
      assert.is_not_nil(json.decode_body(s))
    end)
  end)
end)

describe("json.decode_body", function()
  it("takes at most 3x the body (32 MiB floor) of estimated memory, the last repeated member winning", function()
    assert.equal(32 * 1024 * 1024, json.body_budget(10))
    assert.equal(300 * 1024 * 1024, json.body_budget(100 * 1024 * 1024))
    local v = json.decode_body('{"a":1,"a":2}')
    assert.equal(2, v.a)
    local s = "[" .. ("{},"):rep(6000000) .. "{}]"
    local r, why = json.decode_body(s)
    assert.is_nil(r)
    assert.equal("too large", why)
  end)
end)
