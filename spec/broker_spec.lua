-- broker_spec.lua: the sealed broker end to end over its real Unix socket,
-- against a real loopback upstream (spec/fixtures/fake_upstream.mjs).
-- Items refer to "Behaviours the specs must cover" in spec/broker.md.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local sandbox = require "sandbox"
local model_payload = require "sandbox.providers.openai_chat"
local broker_config = require "sandbox.broker._config"
local H = require "broker_harness"
local fake_upstream = require "fake_upstream"
local unix_request = require "unix_request"

local run = async.run

local fake

local function with_broker(over, fn)
  return run(function()
    fake:reset()
    local b, path, dir = H.start(H.options(fake, over))
    local ok, err = pcall(fn, b, path)
    H.finish(b, dir)
    if not ok then error(err, 0) end
  end)
end

local function upstream_requests()
  return fake:log()
end

local function chat(content)
  return { status = 200, headers = { ["Content-Type"] = "application/json" },
           body = '{"choices":[{"message":{"role":"assistant","content":' .. string.format("%q", content):gsub("\\\n", "\\n") .. '}}]}' }
end

setup(function()
  fake = fake_upstream.start()
end)

teardown(function()
  if fake then fake:stop() end
end)

describe("startup configuration", function()
  local base = {
    model = "test-model", modelUrl = "https://models.example/v1/chat/completions",
    apiKey = function() return "k" end, channel = "fake:guests", speaker = H.SPEAKER,
  }
  local function build(over)
    local o = {}
    for k, v in pairs(base) do o[k] = v end
    for k, v in pairs(over) do o[k] = v end
    local ok, err = pcall(sandbox.broker, o)
    return ok and "ok" or err
  end

  it("refuses an http modelUrl without allowHttp (item 1)", function()
    assert.equal("broker endpoints must be credential-free HTTPS URLs", build { modelUrl = "http://unsafe.example" })
  end)

  it("refuses userinfo, empty userinfo and any fragment (item 2)", function()
    for _, url in ipairs { "https://user:pass@models.example/v1", "https://@models.example/v1",
                           "https://models.example/v1#", "https://models.example/v1#frag",
                           "https://user@models.example/" } do
      assert.equal("broker endpoints must be credential-free HTTPS URLs", build { modelUrl = url }, url)
    end
  end)

  it("accepts a query string (item 3)", function()
    assert.equal("ok", build { modelUrl = "https://models.example/v1/chat?api-version=2024-01-01&x=1" })
  end)

  it("refuses an unparseable endpoint URL (item 4)", function()
    for _, url in ipairs { "not a url", "models.example/v1", "https://", "https:///path", "", "https://exa mple" } do
      assert.equal("invalid broker endpoint URL", build { modelUrl = url }, url)
    end
  end)

  it("refuses budgets out of range (item 5; providers.md 1 moves maxOutputTokens to 1-200,000)", function()
    for _, over in ipairs { { maxCalls = 0 }, { maxCalls = 1001 }, { maxCalls = 1.5 } } do
      assert.equal("invalid broker call or output-token budget", build(over))
    end
    for _, over in ipairs { { maxOutputTokens = 0 }, { maxOutputTokens = 200001 }, { maxOutputTokens = 1.5 } } do
      assert.equal("maxOutputTokens must be 1 to 200000", build(over))
    end
    assert.equal("ok", build { maxCalls = 1000, maxOutputTokens = 200000 })
  end)

  local function tool(name, extra)
    local t = { name = name, description = "d", parameters = { type = "object" }, run = function() return "" end }
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end

  it("refuses a badly named or duplicate host tool (item 6)", function()
    for _, tools in ipairs {
      { tool("Bad") }, { tool("1abc") }, { tool("a-b") }, { tool(string.rep("a", 49)) },
      { tool("clock"), tool("clock") }, { tool("clock\n") }, { tool("ok", { run = "x" }) },
      { tool("ok", { description = 1 }) }, { tool("ok", { parameters = "x" }) },
    } do
      assert.equal("invalid or duplicate host tool", build { tools = tools })
    end
    assert.equal("ok", build { tools = { tool(string.rep("a", 48)), tool("clock") } })
  end)

  it("refuses duplicate MCP servers, bad MCP tool names and repeated tools (item 7)", function()
    local function server(name, tools) return { name = name, url = "https://mcp.example/rpc", tools = tools } end
    local search = { name = "search", description = "s", parameters = { type = "object" } }
    for _, mcp in ipairs {
      { server("public", { search }), server("public", { search }) },
      { server("public", { { name = "Search", description = "s", parameters = {} } }) },
      { server("public", { search, search }) },
      { server("Public", { search }) },
      { { name = "public", url = "https://mcp.example/rpc", tools = { search }, apiKey = "key" } },
    } do
      assert.equal("invalid or duplicate MCP server/tool", build { mcp = mcp })
    end
    assert.equal("broker endpoints must be credential-free HTTPS URLs",
      build { mcp = { { name = "public", url = "http://mcp.example/rpc", tools = { search } } } })
    assert.equal("ok", build { mcp = { server("public", { search }), server("other", { search }) } })
  end)

  it("refuses configured parameters with a remote $schema or more than 64 levels (item 8)", function()
    local remote = tool("t", { parameters = { type = "object", ["$schema"] = "https://json-schema.org/draft/2020-12/schema" } })
    assert.equal("invalid or duplicate host tool", build { tools = { remote } })
    local deep = { type = "object" }
    local cur = deep
    for _ = 1, 64 do cur.items = { type = "array" }; cur = cur.items end
    assert.equal("invalid or duplicate host tool", build { tools = { tool("t", { parameters = deep }) } })
    local ok64 = { type = "object" }
    cur = ok64
    for _ = 1, 63 do cur.items = { type = "array" }; cur = cur.items end
    assert.equal("ok", build { tools = { tool("t", { parameters = ok64 }) } })
    local cyclic = { type = "object" }
    cyclic.properties = { self = cyclic }
    assert.equal("invalid or duplicate host tool", build { tools = { tool("t", { parameters = cyclic }) } })
  end)

  it("refuses a socket path over 100 bytes with `broker socket path too long` (item 9)", function()
    local b = sandbox.broker(base)
    local ok, err = b:start("/tmp/" .. string.rep("x", 100) .. "/broker.sock")
    assert.is_nil(ok)
    assert.equal("broker socket path too long", err)
  end)

  it("requires a model and refuses unknown sandbox options and a bad turnTimeoutMs (items 5, 11)", function()
    assert.equal("model is required", build { model = " \t\u{3000}" })
    local ok, err = pcall(sandbox, { model = "m", modelUrl = "https://x.example/", bogus = 1 })
    assert.is_false(ok); assert.equal("unknown sandbox option: bogus", err)
    ok, err = pcall(sandbox, { model = "m", modelUrl = "https://x.example/", turnTimeoutMs = -1 })
    assert.is_false(ok); assert.equal("turnTimeoutMs must be 1000 to 600000", err)
  end)

  it("is never started without a non-empty principalId", function()
    local o = {}
    for k, v in pairs(base) do o[k] = v end
    o.speaker = { id = "", name = "", principalId = "" }
    local b = sandbox.broker(o)          -- the startup check builds one without serving
    assert.has_error(function() b:start("/tmp/never.sock") end,
      "a broker is never started without a non-empty principalId")
  end)
end)

describe("socket", function()
  it("serves /model over a 0600 socket inside a 0700 dir (item 12)", function()
    with_broker({}, function(_, path)
      local dir = path:match("^(.*)/broker.sock$")
      assert.equal("700", H.sh("stat -c %a '" .. dir .. "'"))
      assert.equal("600", H.sh("stat -c %a '" .. path .. "'"))
      local r = H.post(path, "/model")
      assert.equal(200, r.status)
      assert.equal("ok", json.decode(r.body).choices[1].message.content)
    end)
  end)

  it("binds the identity copied at construction (item 18)", function()
    run(function()
      fake:reset()
      local seen
      local tools = { { name = "whoami", description = "d", parameters = { type = "object" },
                        run = function(_, ctx) seen = ctx.speaker.id .. "/" .. ctx.speaker.principalId; return "x" end } }
      local speaker = { id = "guest-a", name = "Guest", principalId = "p-guest-a" }
      local b, path, dir = H.start(H.options(fake, { speaker = speaker, tools = tools }))
      speaker.id, speaker.principalId = "owner", "p-owner"
      assert.equal(200, H.post(path, "/tools/whoami", "{}").status)
      H.finish(b, dir)
      assert.equal("guest-a/p-guest-a", seen)
    end)
  end)

  it("removes the socket on a forced stop", function()
    run(function()
      local b, path, dir = H.start(H.options(fake))
      b:stop()
      async.sleep(0)
      assert.is_nil(io.open(path, "r"))
      H.rmdir(dir)
    end)
  end)
end)

describe("/model upstream request", function()
  it("forwards only the rebuilt body with the real key, forced model and max_tokens (item 40)", function()
    with_broker({}, function(_, path)
      local body = '{"model":"expensive","max_tokens":999999,"callback_url":"https://guest.example/cb",' ..
        '"stream":true,"temperature":2,"messages":[{"role":"user","content":"hi"}]}'
      local r = H.post(path, "/model", body, {
        { "Host", "broker" }, { "Content-Type", "application/json" }, { "Authorization", H.DUMMY },
        { "User-Agent", "guest" } })
      assert.equal(200, r.status)
      local log = upstream_requests()
      assert.equal(1, #log)
      local req = log[1]
      assert.equal("POST", req.method)
      assert.equal("/v1/chat/completions", req.url)
      assert.equal("Bearer real-model-key", H.header(req, "authorization"))
      assert.is_nil(H.header(req, "user-agent"))
      assert.is_nil(H.header(req, "accept-encoding"))
      assert.is_nil(H.header(req, "expect"))
      assert.equal("application/json", H.header(req, "accept"))
      assert.equal("application/json", H.header(req, "content-type"))
      assert.equal('{"model":"test-model","messages":[{"role":"user","content":"hi"}],"stream":false,"max_tokens":4096}', req.body)
    end)
  end)

  it("uses a modelUrl with a query string verbatim (item 3)", function()
    run(function()
      fake:reset()
      local b, path, dir = H.start(H.options(fake, { modelUrl = fake:url("/v1/chat?api-version=1&x=%41") }))
      assert.equal(200, H.post(path, "/model").status)
      assert.equal("/v1/chat?api-version=1&x=%41", upstream_requests()[1].url)
      H.finish(b, dir)
    end)
  end)

  it("passes no upstream response header to the guest (item 41)", function()
    with_broker({}, function(_, path)
      fake:script { { status = 200, headers = { ["Set-Cookie"] = "s=1", ["Authorization"] = "Bearer x",
        ["Connection"] = "keep-alive", ["X-RateLimit-Remaining"] = "9", ["Content-Type"] = "application/json" },
        body = '{"ok":true}' } }
      local r = H.post(path, "/model")
      assert.equal(200, r.status)
      assert.same({ { "Content-Type", "application/json;charset=utf-8" }, { "Content-Length", tostring(#r.body) },
                    { "Connection", "close" } }, r.headers)
      assert.equal('{"ok":true}', r.body)
    end)
  end)

  it("keeps the forced body's member order and {} / [] (item 52)", function()
    with_broker({}, function(_, path)
      local body = '{"tools":[{"type":"function","function":{"name":"f","description":"","parameters":{"type":"object","properties":{}}}}],' ..
        '"messages":[{"role":"assistant","content":"","tool_calls":[]}]}'
      assert.equal(200, H.post(path, "/model", body).status)
      assert.equal('{"model":"test-model","messages":[{"role":"assistant","content":"","tool_calls":[]}],' ..
        '"tools":[{"type":"function","function":{"name":"f","description":"","parameters":{"type":"object","properties":{}}}}],' ..
        '"stream":false,"max_tokens":4096}', upstream_requests()[1].body)
    end)
  end)
end)

describe("/model validation", function()
  local REFUSED = "text/function model payload required"
  local function refused(body)
    local r
    with_broker({}, function(_, path)
      r = H.post(path, "/model", body)
      assert.equal(0, #upstream_requests())
    end)
    return r
  end

  local function msg(m) return '{"messages":[' .. m .. ']}' end

  it("refuses an image_url content part with 400 and no upstream call (item 42)", function()
    local r = refused(msg '{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x.example/a.png"}}]}')
    assert.equal(400, r.status)
    assert.equal(REFUSED, r.body)
  end)

  it("refuses file and input_audio parts, file_id, role developer and web_search tool calls (item 43)", function()
    for _, body in ipairs {
      msg '{"role":"user","content":[{"type":"file","file":{"file_id":"f"}}]}',
      msg '{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"","format":"wav"}}]}',
      msg '{"role":"user","content":"x","file_id":"f"}',
      msg '{"role":"developer","content":"x"}',
      msg '{"role":"function","content":"x"}',
      msg '{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"web_search","function":{"name":"f","arguments":"{}"}}]}',
      msg '{"role":"user","content":null}',
      msg '{"role":"user"}',
      msg '{"role":"user","content":"x","name":"bob"}',
    } do
      assert.equal(400, refused(body).status, body)
    end
  end)

  it("refuses web_search/file_search tools and a remote $ref in parameters (item 44)", function()
    for _, tools in ipairs {
      '[{"type":"web_search"}]', '[{"type":"file_search"}]',
      '[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"$ref":"https://evil.example/s.json"}}}}}]',
      '[{"type":"function","function":{"name":"f","description":"d","parameters":true}}]',
      '[{"type":"function","function":{"name":"f","parameters":{}}}]',
    } do
      assert.equal(400, refused('{"messages":[],"tools":' .. tools .. '}').status, tools)
    end
  end)

  it("accepts a full transcript and drops function.url and extra_provider_option (item 45)", function()
    with_broker({}, function(_, path)
      local body = '{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},' ..
        '{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","index":0,"function":{"name":"clock","arguments":"{}","url":"https://x.example"}}]},' ..
        '{"role":"tool","content":"12:00","tool_call_id":"call_1"}],' ..
        '"tools":[{"type":"function","strict":true,"extra_provider_option":1,"function":{"name":"clock","description":"d","parameters":{"type":"object"}}}]}'
      assert.equal(200, H.post(path, "/model", body).status)
      assert.equal('{"model":"test-model","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},' ..
        '{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"clock","arguments":"{}"}}]},' ..
        '{"role":"tool","content":"12:00","tool_call_id":"call_1"}],' ..
        '"tools":[{"type":"function","function":{"name":"clock","description":"d","parameters":{"type":"object"}}}],' ..
        '"stream":false,"max_tokens":4096}', upstream_requests()[1].body)
    end)
  end)

  local function with_params(params)
    return { messages = json.array(), tools = json.array { json.object({ "type", "function" }, {
      type = "function",
      ["function"] = json.object({ "name", "description", "parameters" }, { name = "f", description = "d", parameters = params }),
    }) } }
  end
  local function params_ok(p)
    return model_payload.rebuild(json.decode(json.encode(with_params(p))), "m", 1) ~= nil
  end

  it("refuses remote refs and remote $vocabulary keys in nested schemas (item 46)", function()
    for _, kw in ipairs { "$ref", "$dynamicRef", "$recursiveRef", "$schema", "$id" } do
      assert.is_false(params_ok { type = "object", properties = { example = { [kw] = "https://evil.example/x" } } }, kw)
      assert.is_false(params_ok { type = "object", properties = { example = { [kw] = "other.json#/a" } } }, kw)
      assert.is_false(params_ok { type = "object", properties = { example = { [kw] = 5 } } }, kw)
      assert.is_true(params_ok { type = "object", properties = { example = { [kw] = "#/$defs/x" } } }, kw)
    end
    assert.is_false(params_ok { type = "object", ["$vocabulary"] = { ["https://json-schema.org/draft/2020-12/vocab/core"] = true } })
    assert.is_true(params_ok { type = "object", ["$vocabulary"] = { ["#core"] = true } })
    assert.is_false(params_ok { type = "object", properties = { a = json.null } })
    assert.is_false(params_ok { type = "object", allOf = { type = "x" } })
    assert.is_false(params_ok { type = "object", items = json.array { { ["$ref"] = "http://x.example" } } })
    assert.is_false(params_ok { type = "object", dependencies = { a = { ["$ref"] = "http://x" } } })
    assert.is_true(params_ok { type = "object", dependencies = { a = json.array { "b" } } })
  end)

  it("accepts properties named $ref/$schema, an enum holding a remote $ref, and local allOf refs (item 47)", function()
    assert.is_true(params_ok { type = "object", properties = { ["$ref"] = { type = "string" }, ["$schema"] = { type = "string" } } })
    assert.is_true(params_ok { type = "object", properties = { a = { enum = json.array { { ["$ref"] = "https://evil.example" } } } } })
    assert.is_true(params_ok { type = "object", allOf = json.array { { ["$ref"] = "#/$defs/item" } }, ["$defs"] = { item = { type = "string" } } })
    with_broker({}, function(_, path)
      local body = '{"messages":[],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":' ..
        '{"type":"object","properties":{"$ref":{"type":"string"}},"allOf":[{"$ref":"#/$defs/item"}],"$defs":{"item":{}}}}}]}'
      assert.equal(200, H.post(path, "/model", body).status)
    end)
  end)

  it("refuses schemas nested past 64 levels (400) and bodies past 64 JSON levels (502) (item 48)", function()
    local deep = { type = "object" }
    local cur = deep
    for _ = 1, 64 do cur.items = { type = "array" }; cur = cur.items end
    local rebuilt, err = model_payload.rebuild(with_params(deep), "m", 1)
    assert.is_nil(rebuilt)
    assert.equal(REFUSED, err)
    with_broker({}, function(_, path)
      local body = '{"messages":[],"x":' .. string.rep("[", 64) .. string.rep("]", 64) .. '}'
      local r = H.post(path, "/model", body)
      assert.equal(502, r.status)
      assert.equal("broker call failed", r.body)
    end)
  end)

  it("enforces counts, call ids, tool_call_id placement and unique tool names (item 49)", function()
    local many = {}
    for i = 1, 129 do many[i] = '{"role":"user","content":"' .. i .. '"}' end
    local tool = '{"type":"function","function":{"name":"f%d","description":"","parameters":{}}}'
    local tools = {}
    for i = 1, 129 do tools[i] = tool:format(i) end
    local calls = {}
    for i = 1, 9 do calls[i] = '{"id":"c' .. i .. '","type":"function","function":{"name":"f","arguments":"{}"}}' end
    for _, body in ipairs {
      '{"messages":[' .. table.concat(many, ",") .. ']}',
      '{"messages":[],"tools":[' .. table.concat(tools, ",") .. ']}',
      msg('{"role":"assistant","content":"","tool_calls":[' .. table.concat(calls, ",") .. ']}'),
      msg('{"role":"tool","content":"x","tool_call_id":"' .. string.rep("a", 129) .. '"}'),
      msg '{"role":"user","content":"x","tool_call_id":"c1"}',
      msg '{"role":"tool","content":"x"}',
      msg '{"role":"tool","content":"x","tool_call_id":""}',
      '{"messages":[],"tools":[' .. tool:format(1) .. ',' .. tool:format(1) .. ']}',
      msg '{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"Bad-Name","arguments":"{}"}}]}',
      msg '{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{}}}]}',
    } do
      assert.equal(400, refused(body).status, body:sub(1, 80))
    end
    with_broker({}, function(_, path)
      local id = string.rep("é", 128)
      assert.equal(200, H.post(path, "/model", msg('{"role":"tool","content":"x","tool_call_id":"' .. id .. '"}')).status)
      local ok128 = {}
      for i = 1, 128 do ok128[i] = many[i] end
      assert.equal(200, H.post(path, "/model", '{"messages":[' .. table.concat(ok128, ",") .. ']}').status)
    end)
  end)

  it("refuses a missing messages and tools:null (item 50)", function()
    assert.equal(400, refused('{}').status)
    assert.equal(400, refused('{"messages":{}}').status)
    assert.equal(400, refused('{"messages":[],"tools":null}').status)
  end)

  it("answers 502 for invalid UTF-8, a BOM, an unpaired surrogate or a repeated member (item 51)", function()
    with_broker({}, function(_, path)
      for _, body in ipairs { '{"messages":[],"x":"\255"}', '\239\187\191{"messages":[]}',
                              '{"messages":[],"x":"\\ud800"}', '{"messages":[],"messages":[]}' } do
        local r = H.post(path, "/model", body)
        assert.equal(502, r.status)
        assert.equal("broker call failed", r.body)
      end
      assert.equal(0, #upstream_requests())
    end)
  end)

  it("answers 400 invalid input for a JSON value that is not an object", function()
    with_broker({}, function(_, path)
      for _, body in ipairs { '[]', '"x"', '1', 'true', 'null' } do
        local r = H.post(path, "/model", body)
        assert.equal(400, r.status)
        assert.equal("invalid input", r.body)
      end
    end)
  end)
end)

describe("/model credential", function()
  it("calls apiKey with a fresh {channel, speaker} scope per call, per broker (item 53)", function()
    run(function()
      fake:reset()
      local seen, n = {}, 0
      local function hook(scope)
        n = n + 1
        seen[#seen + 1] = scope
        scope.channel = "tampered"
        return scope.speaker.name:lower() .. "-key-" .. n
      end
      local function start(channel, id)
        return H.start(H.options(fake, { apiKey = function(s) return hook(s) end, maxCalls = 4, channel = channel,
          speaker = { id = id, name = channel:match(":(.*)"), principalId = "p-" .. id } }))
      end
      local a, pa, da = start("fake:alpha", "guest-a")
      local b, pb, db = start("fake:beta", "guest-b")
      assert.equal(200, H.post(pa, "/model").status)
      assert.equal(200, H.post(pb, "/model").status)
      assert.equal(200, H.post(pa, "/model").status)
      local auth = {}
      for _, req in ipairs(upstream_requests()) do auth[#auth + 1] = H.header(req, "authorization") end
      assert.same({ "Bearer alpha-key-1", "Bearer beta-key-2", "Bearer alpha-key-3" }, auth)
      for _, s in ipairs(seen) do s.channel = nil end
      assert.same({
        { speaker = { id = "guest-a", name = "alpha", principalId = "p-guest-a" } },
        { speaker = { id = "guest-b", name = "beta", principalId = "p-guest-b" } },
        { speaker = { id = "guest-a", name = "alpha", principalId = "p-guest-a" } },
      }, seen)
      H.finish(a, da); H.finish(b, db)
    end)
  end)

  it("works with a zero-argument apiKey and one that yields", function()
    with_broker({ apiKey = function() async.sleep(5); return H.KEY end }, function(_, path)
      assert.equal(200, H.post(path, "/model").status)
      assert.equal("Bearer real-model-key", H.header(upstream_requests()[1], "authorization"))
    end)
  end)

  it("fails closed with 502 and spends budget for nil, empty, non-string, spaced or raising hooks (item 54)", function()
    for _, hook in ipairs {
      function() return nil end, function() return "" end, function() return 42 end,
      function() return "real key" end, function() return "real\nkey" end, function() return "ké" end,
      function() error("vault down") end,
    } do
      with_broker({ apiKey = hook }, function(b, path)
        local r = H.post(path, "/model")
        assert.equal(502, r.status)
        assert.equal("broker call failed", r.body)
        assert.equal(47, b:stats().budget)
        assert.equal(0, #upstream_requests())
      end)
    end
  end)

  it("answers 502 for an upstream 401 echoing the key (item 55)", function()
    with_broker({}, function(_, path)
      fake:script { { status = 401, body = "real-model-key" } }
      local r = H.post(path, "/model")
      assert.equal(502, r.status)
      assert.is_nil(r.raw:find("real-model-key", 1, true))
    end)
  end)

  it("does not follow a 307, so the second server is never contacted (item 56)", function()
    local second = fake_upstream.start()
    with_broker({}, function(_, path)
      fake:script { { status = 307, headers = { Location = second:url("/steal") }, body = "" } }
      assert.equal(502, H.post(path, "/model").status)
      second:reset()
      assert.equal(0, #second:log())
    end)
    second:stop()
  end)

  it("answers 502 for a reply over 1 MiB, a non-JSON reply and Content-Encoding gzip (item 57)", function()
    for _, resp in ipairs {
      { status = 200, body = '{"x":"' .. string.rep("a", 1048576) .. '"}' },
      { status = 200, body = "<html>hi</html>" },
      { status = 200, headers = { ["Content-Encoding"] = "gzip" }, body = '{"ok":true}' },
    } do
      with_broker({}, function(_, path)
        fake:script { resp }
        assert.equal(502, H.post(path, "/model").status)
      end)
    end
  end)
end)

describe("reflection filter", function()
  local function reflected(body)
    local r
    with_broker({}, function(_, path)
      fake:script { { status = 200, body = body } }
      r = H.post(path, "/model")
    end)
    return r
  end

  it("refuses a reply holding the key (item 68)", function()
    local r = reflected('{"token":"real-model-key"}')
    assert.equal(502, r.status)
    assert.is_nil(r.raw:find("real-model-key", 1, true))
  end)

  it("refuses an escaped echo (item 69)", function()
    assert.equal(502, reflected('{"token":"real\\u002dmodel\\u002dkey"}').status)
  end)

  it("refuses every encoded form and the key as a member name (item 70)", function()
    local key = H.KEY
    for _, form in ipairs {
      key:gsub("[^%w%-_%.!~%*'%(%)]", function(c) return string.format("%%%02X", c:byte()) end),
      core.base64(key), core.base64url(key), core.hex(key), core.hex(key):upper(),
    } do
      assert.equal(502, reflected('{"a":"xx' .. form .. 'yy"}').status, form)
    end
    assert.equal(502, reflected('{"real-model-key":1}').status)
    assert.equal(502, reflected('["x",{"deep":["real-model-key"]}]').status)
  end)

  it("never counts numbers, booleans or null (item 71)", function()
    assert.equal(200, reflected('{"a":1234,"b":true,"c":null,"d":[1.5,false]}').status)
  end)
end)

describe("/tools/<name>", function()
  local calls
  local function tools(run_fn)
    return { { name = "probe", description = "d", parameters = { type = "object" }, run = run_fn } }
  end

  it("binds ctx to the turn, not the body (item 58)", function()
    calls = {}
    with_broker({ tools = tools(function(input, ctx)
      calls[#calls + 1] = { channel = ctx.channel, id = ctx.speaker.id, principal = ctx.speaker.principalId,
                            input_speaker = input.speaker, aborted = ctx.signal.aborted }
      return "done"
    end) }, function(_, path)
      local r = H.post(path, "/tools/probe", '{"speaker":"owner","channel":"fake:private","principalId":"p-owner"}')
      assert.equal(200, r.status)
      assert.equal('{"text":"done"}', r.body)
    end)
    assert.same({ { channel = "fake:guests", id = "guest-a", principal = "p-guest-a", input_speaker = "owner", aborted = false } }, calls)
  end)

  it("returns a reply of exactly 1,048,576 bytes and refuses one byte more (item 60)", function()
    local size = 1048576 - #'{"text":""}'
    for _, case in ipairs { { size, 200 }, { size + 1, 502 } } do
      with_broker({ tools = tools(function() return string.rep("a", case[1]) end) }, function(_, path)
        local r = H.post(path, "/tools/probe", "{}")
        assert.equal(case[2], r.status)
        if case[2] == 200 then assert.equal(1048576, #r.body) end
      end)
    end
    -- escapes count: 524,284 newlines encode to 1,048,568 bytes + 11
    with_broker({ tools = tools(function() return string.rep("\n", 524283) end) }, function(_, path)
      assert.equal(502, H.post(path, "/tools/probe", "{}").status)
    end)
  end)

  it("answers 502 without error text for non-strings, invalid UTF-8 and raised errors (item 61)", function()
    for _, fn in ipairs {
      function() return 42 end, function() return nil end, function() return "\255\254" end,
      function() error("secret detail /etc/passwd") end, function() return { text = "x" } end,
    } do
      with_broker({ tools = tools(fn) }, function(_, path)
        local r = H.post(path, "/tools/probe", "{}")
        assert.equal(502, r.status)
        assert.equal("broker call failed", r.body)
      end)
    end
  end)

  it("keeps the broker busy while a callback ignores its signal (item 62)", function()
    local release
    with_broker({ tools = tools(function()
      async.await(function(resume) release = resume end)
      return "late"
    end) }, function(b, path)
      local first = async.spawn(function() return H.post(path, "/tools/probe", "{}") end)
      for _ = 1, 500 do if release then break end; async.sleep(10) end
      assert.is_not_nil(release)
      local busy = H.post(path, "/model")
      assert.equal(429, busy.status)
      assert.equal("call budget exhausted or busy", busy.body)
      release()
      local ok, r = async.wait(first)
      assert.is_true(ok)
      assert.equal(200, r.status)
      assert.equal(200, H.post(path, "/model").status)
      assert.equal(46, b:stats().budget)
    end)
  end)

  it("aborts ctx.signal when the client goes away and answers later calls again", function()
    local aborted_with
    local done, started = false, false
    with_broker({ tools = tools(function(_, ctx)
      started = true
      ctx.signal:on_abort(function(reason) aborted_with = reason end)
      while not ctx.signal.aborted do async.sleep(10) end
      done = true
      return "x"
    end) }, function(_, path)
      local h = unix_request(path, H.raw("/tools/probe", "{}"), { timeout_ms = 5000 }, function() end)
      for _ = 1, 500 do if started then break end; async.sleep(10) end
      assert.is_true(started)
      h:close()
      for _ = 1, 100 do if done then break end; async.sleep(10) end
      assert.is_true(done)
      assert.equal("client closed", aborted_with)
      assert.equal(200, H.post(path, "/model").status)
    end)
  end)

  it("aborts a pending callback's signal when the turn ends (item 17)", function()
    local signal_seen
    with_broker({ tools = tools(function(_, ctx)
      signal_seen = ctx.signal
      while not ctx.signal.aborted do async.sleep(10) end
      return "x"
    end) }, function(b, path)
      local h = unix_request(path, H.raw("/tools/probe", "{}"), { timeout_ms = 5000 }, function() end)
      for _ = 1, 500 do if signal_seen then break end; async.sleep(10) end
      assert.is_not_nil(signal_seen)
      b:end_turn()
      async.sleep(30)
      assert.is_true(signal_seen.aborted)
      local r = H.post(path, "/model")
      assert.equal(410, r.status)
      h:close()
    end)
  end)
end)

describe("budget and concurrency", function()
  it("spends budget on failures and answers 429 once it is gone (item 72)", function()
    with_broker({ maxCalls = 2, apiKey = function() return nil end }, function(b, path)
      assert.equal(502, H.post(path, "/model").status)
      local big = '"' .. string.rep("a", 270000) .. '"'
      assert.equal(502, H.post(path, "/model", big).status)
      local r = H.post(path, "/model")
      assert.equal(429, r.status)
      assert.equal("call budget exhausted or busy", r.body)
      assert.equal(0, b:stats().budget)
    end)
  end)

  it("answers 429 at once to a second call while one is in flight (item 73)", function()
    with_broker({}, function(b, path)
      fake:script { { status = 200, delay_ms = 300, body = '{"ok":1}' } }
      local first = async.spawn(function() return H.post(path, "/model") end)
      for _ = 1, 500 do if b:stats().in_flight then break end; async.sleep(5) end
      assert.is_true(b:stats().in_flight)
      assert.equal(429, H.post(path, "/model").status)
      assert.is_false(first.done)          -- refused, not queued behind the first
      local _, r = async.wait(first)
      assert.equal(200, r.status)
    end)
  end)

  it("answers 410 on every known route after the turn ends, before 429 (item 29)", function()
    with_broker({ maxCalls = 1 }, function(b, path)
      assert.equal(200, H.post(path, "/model").status)
      b:end_turn()
      assert.equal(410, H.post(path, "/model").status)
      assert.equal(404, H.post(path, "/nope").status)
    end)
  end)
end)

describe("logs", function()
  it("never log the credential or payloads", function()
    local log = os.tmpname()
    -- Everything the broker writes goes through core.log/stderr; capture the
    -- stderr of a subprocess running a refused and an accepted call.
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
      local async = require "sandbox.async"
      local H = require "broker_harness"
      local fake = require("fake_upstream").start()
      async.run(function()
        local b, path, dir = H.start(H.options(fake, { tools = { { name = "t", description = "", parameters = {},
          run = function() error("real-model-key in an error") end } } }))
        fake:script { { status = 401, body = "real-model-key" }, { status = 200, body = '{"k":"real-model-key"}' } }
        H.post(path, "/model", '{"messages":[{"role":"user","content":"payload-marker"}]}')
        H.post(path, "/model", '{"messages":[{"role":"user","content":"payload-marker"}]}')
        H.post(path, "/tools/t", '{"x":"payload-marker"}')
        H.finish(b, dir)
      end)
      fake:stop()
    ]])
    f:close()
    local cpath = package.cpath:match("[^;]*build[^;]*") or "build/lua/?.so"
    local ok = os.execute("SBX_DEBUG= lua5.4 -e 'package.path=\"lua/?.lua;lua/?/init.lua;spec/support/?.lua;\"..package.path; package.cpath=\"" ..
      cpath .. ";\"..package.cpath' " .. script .. " 2>" .. log)
    assert.is_true(ok == true or ok == 0)
    local text = assert(io.open(log)):read("a")
    os.remove(log); os.remove(script)
    assert.is_nil(text:find("real-model-key", 1, true))
    assert.is_nil(text:find("payload-marker", 1, true))
  end)
end)

describe("/model over HTTPS", function()
  local dir, tls_fake

  setup(function()
    dir = H.tmpdir()
    tls_fake = fake_upstream.start({ tls = fake_upstream.make_ca(dir) })
  end)
  teardown(function()
    if tls_fake then tls_fake:stop() end
    H.rmdir(dir)
  end)

  local function https_options(with_ca)
    local seams = tls_fake:seams()
    return H.options(tls_fake, {
      allowHttp = false,
      modelUrl = tls_fake:url("/v1/chat/completions"),
      transport = { cainfo = with_ca and seams.cainfo or nil, connectTo = seams.connect_to },
    })
  end

  it("reaches https://models.example with the real key through the trusted transport seam", function()
    run(function()
      tls_fake:reset()
      local b, path, bdir = H.start(https_options(true))
      local r = H.post(path, "/model")
      H.finish(b, bdir)
      assert.equal(200, r.status)
      local log = tls_fake:log()
      assert.equal(1, #log)
      assert.equal("Bearer real-model-key", H.header(log[1], "authorization"))
    end)
  end)

  it("answers 502 when the upstream certificate is not trusted", function()
    run(function()
      tls_fake:reset()
      local b, path, bdir = H.start(https_options(false))
      local r = H.post(path, "/model")
      H.finish(b, bdir)
      assert.equal(502, r.status)
      assert.equal(0, #tls_fake:log())
    end)
  end)
end)
