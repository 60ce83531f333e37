-- mcp_route_spec.lua: POST /mcp/<server> (spec/broker.md section 11) against a
-- loopback fake MCP endpoint, and interoperability with a real MCP server
-- built on the official @modelcontextprotocol/sdk (spec/fixtures/mcp_server.mjs).
local async = require "sandbox.async"
local json = require "sandbox.json"
local H = require "broker_harness"
local fake_upstream = require "fake_upstream"

local run = async.run
local fake

local SEARCH = { name = "search", description = "Search.", parameters = { type = "object", properties = { query = { type = "string" } } } }
local DELETE_ELSEWHERE = { name = "delete", description = "Delete.", parameters = { type = "object" } }

local function mcp_options(over)
  local o = H.options(fake, {
    mcp = {
      { name = "public", url = fake:url("/rpc"), apiKey = function() return H.MCP_KEY end, tools = { SEARCH } },
      { name = "other", url = fake:url("/other"), tools = { DELETE_ELSEWHERE } },
    },
  })
  for k, v in pairs(over or {}) do o[k] = v end
  return o
end

local function with_mcp(over, fn)
  return run(function()
    fake:reset()
    local b, path, dir = H.start(mcp_options(over))
    local ok, err = pcall(fn, b, path)
    H.finish(b, dir)
    if not ok then error(err, 0) end
  end)
end

local CALL = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search","arguments":{"query":"hello"}}}'
local RESULT = '{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"r"}]}}'

setup(function() fake = fake_upstream.start() end)
teardown(function() if fake then fake:stop() end end)

describe("/mcp/<server>", function()
  it("refuses resources/read and an undeclared tool with 403, a batch with 400 (item 63)", function()
    with_mcp({}, function(b, path)
      local r = H.post(path, "/mcp/public", '{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///etc/passwd"}}')
      assert.equal(403, r.status)
      assert.equal("MCP method or tool refused", r.body)
      r = H.post(path, "/mcp/public", '{"method":"tools/call","params":{"name":"delete","arguments":{}}}')
      assert.equal(403, r.status)
      for _, m in ipairs { "initialize", "tools/list", "ping", "notifications/initialized", "prompts/get" } do
        assert.equal(403, H.post(path, "/mcp/public", '{"jsonrpc":"2.0","id":1,"method":"' .. m .. '","params":{}}').status)
      end
      r = H.post(path, "/mcp/public", '[' .. CALL .. ']')
      assert.equal(400, r.status)
      assert.equal("invalid input", r.body)
      assert.equal(0, #fake:log())
      assert.equal(48 - 8, b:stats().budget)
    end)
  end)

  it("forwards only the rebuilt body with the server's key, exactly once (item 64)", function()
    with_mcp({}, function(_, path)
      fake:script { { status = 200, headers = { ["Content-Type"] = "application/json" }, body = RESULT } }
      local body = '{"jsonrpc":"2.0","id":99,"url":"https://guest.example","method":"tools/call",' ..
        '"params":{"name":"search","arguments":{"query":"hello"},"_meta":{"progressToken":1}}}'
      local r = H.post(path, "/mcp/public", body)
      assert.equal(200, r.status)
      assert.equal(RESULT, r.body)
      local log = fake:log()
      assert.equal(1, #log)
      assert.equal("/rpc", log[1].url)
      assert.equal("Bearer real-mcp-key", H.header(log[1], "authorization"))
      assert.equal("application/json, text/event-stream", H.header(log[1], "accept"))
      assert.is_nil(H.header(log[1], "mcp-session-id"))
      assert.is_nil(H.header(log[1], "mcp-protocol-version"))
      assert.equal('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"query":"hello"}}}', log[1].body)
    end)
  end)

  it("refuses missing, null or array arguments and a tool of another server (item 65)", function()
    with_mcp({}, function(_, path)
      for _, params in ipairs { '{"name":"search"}', '{"name":"search","arguments":null}',
                                '{"name":"search","arguments":[]}', '{"name":"search","arguments":"x"}',
                                '{"name":"delete","arguments":{}}', '[]', 'null' } do
        local r = H.post(path, "/mcp/public", '{"method":"tools/call","params":' .. params .. '}')
        assert.equal(403, r.status, params)
      end
      assert.equal(0, #fake:log())
      fake:script { { status = 200, body = RESULT } }
      assert.equal(200, H.post(path, "/mcp/public", '{"method":"tools/call","params":{"name":"search","arguments":{}}}').status)
    end)
  end)

  it("sends no Authorization and does not filter when the hook returns nil (item 66)", function()
    with_mcp({ mcp = { { name = "public", url = fake:url("/rpc"), apiKey = function() return nil end, tools = { SEARCH } } } },
      function(_, path)
        fake:script { { status = 200, body = '{"jsonrpc":"2.0","id":1,"result":{"echo":"real-model-key"}}' } }
        local r = H.post(path, "/mcp/public", CALL)
        assert.equal(200, r.status)
        assert.is_nil(H.header(fake:log()[1], "authorization"))
      end)
  end)

  it("filters reflections of the MCP key", function()
    with_mcp({}, function(_, path)
      fake:script { { status = 200, body = '{"jsonrpc":"2.0","id":1,"result":{"echo":"real-mcp-key"}}' } }
      assert.equal(502, H.post(path, "/mcp/public", CALL).status)
    end)
  end)

  it("fails closed when the MCP hook raises or returns a bad value", function()
    for _, hook in ipairs { function() error("x") end, function() return 5 end, function() return "a b" end } do
      with_mcp({ mcp = { { name = "public", url = fake:url("/rpc"), apiKey = hook, tools = { SEARCH } } } }, function(_, path)
        assert.equal(502, H.post(path, "/mcp/public", CALL).status)
        assert.equal(0, #fake:log())
      end)
    end
  end)

  it("answers 502 for an SSE body and an empty 202 (item 67)", function()
    for _, resp in ipairs {
      { status = 200, headers = { ["Content-Type"] = "text/event-stream" }, body = "event: message\ndata: " .. RESULT .. "\n\n" },
      { status = 202, body = "" },
    } do
      with_mcp({}, function(_, path)
        fake:script { resp }
        assert.equal(502, H.post(path, "/mcp/public", CALL).status)
      end)
    end
  end)
end)

describe("/mcp/<server> against the official MCP SDK server", function()
  local mcp_server = require "mcp_server"
  local server

  setup(function()
    local ok, s = pcall(mcp_server.start, { require_key = H.MCP_KEY })
    if ok then server = s end
  end)
  teardown(function() if server then server:stop() end end)

  it("calls a declared tool on a stateless Streamable HTTP server and returns its JSON answer", function()
    if not server then
      pending("the MCP SDK fixture is not installed (run make deps)")
      return
    end
    run(function()
      local b, path, dir = H.start(H.options(fake, {
        mcp = { { name = "docs", url = server.url, apiKey = function() return H.MCP_KEY end, tools = { SEARCH } } },
      }))
      local r = H.post(path, "/mcp/docs", CALL)
      H.finish(b, dir)
      assert.equal(200, r.status)
      local msg = json.decode(r.body)
      assert.equal("2.0", msg.jsonrpc)
      assert.equal(1, msg.id)
      assert.equal("results for hello", msg.result.content[1].text)
    end)
  end)
end)
