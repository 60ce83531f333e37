-- schema_spec.lua: the schema locality walk of tool parameters
-- (lua/sandbox/broker/_schema.lua; spec/broker.md 9.4): only local
-- references ("#...") anywhere a schema can sit, at most 64 levels.
local json = require "sandbox.json"
local schema = require "sandbox.broker._schema"

local ok = schema.parameters_ok

local function decoded(s) return assert(json.decode(s)) end

describe("parameters_ok", function()
  it("accepts plain and decoded object schemas with local references", function()
    assert.is_true(ok({ type = "object", properties = { a = { type = "string" } } }))
    assert.is_true(ok(decoded('{"type":"object","properties":{"n":{"$ref":"#/$defs/n"}},'
      .. '"$defs":{"n":{"type":"integer"}},"required":["n"]}')))
    assert.is_true(ok(decoded('{"items":[true,{"$ref":"#x"}],"not":false}')))
  end)

  it("refuses a top level that is not an object (true included)", function()
    assert.is_false(ok(true))
    assert.is_false(ok(decoded("[]")))
    assert.is_false(ok("{}"))
  end)

  it("refuses a remote reference wherever a schema can sit", function()
    local remote = '{"$ref":"https://evil.example/s.json"}'
    for _, where in ipairs {
      '{"$ref":"https://evil.example/s.json"}',
      '{"$schema":"http://json-schema.org/draft-07/schema"}',
      '{"$id":"https://evil.example/"}',
      '{"properties":{"a":' .. remote .. '}}',
      '{"patternProperties":{"^a":' .. remote .. '}}',
      '{"$defs":{"a":' .. remote .. '}}',
      '{"definitions":{"a":' .. remote .. '}}',
      '{"items":' .. remote .. '}',
      '{"items":[' .. remote .. ']}',
      '{"additionalProperties":' .. remote .. '}',
      '{"allOf":[' .. remote .. ']}',
      '{"anyOf":[{},' .. remote .. ']}',
      '{"not":' .. remote .. '}',
      '{"if":{},"then":' .. remote .. '}',
      '{"dependencies":{"a":' .. remote .. '}}',
      '{"$vocabulary":{"https://evil.example/v":true}}',
    } do
      assert.is_false(ok(decoded(where)), where)
    end
  end)

  it("does not walk data members (enum, const, default)", function()
    assert.is_true(ok(decoded('{"enum":[{"$ref":"https://x/"}],"default":{"$ref":"https://x/"}}')))
  end)

  it("refuses the wrong container kind under a schema keyword", function()
    assert.is_false(ok(decoded('{"properties":[]}')))
    assert.is_false(ok(decoded('{"allOf":{}}')))
    assert.is_false(ok(decoded('{"items":"x"}')))
  end)

  it("stops at 64 levels, which also ends a cycle in a Lua table", function()
    local function nest(n)
      local s = { type = "string" }
      for _ = 2, n do s = { properties = { a = s } } end
      return s
    end
    -- the top level is level 1; each schema under properties one more
    assert.is_true(ok(nest(64)))
    assert.is_false(ok(nest(65)))
    local cyclic = { properties = {} }
    cyclic.properties.self = cyclic
    assert.is_false(ok(cyclic))
  end)
end)
