-- mcp_fixture_spec.lua: the real MCP server fixture (spec/fixtures/mcp_server.mjs,
-- official SDK, stateless Streamable HTTP with JSON responses) behaves as the
-- broker specs assume: a tools/call of `search` gets a JSON-RPC result when the
-- request lists both JSON and event-stream in Accept, 406 otherwise, and the
-- server records what it received. Checked once with node's own fetch (so a
-- broken fixture is told apart from a broken core) and once through
-- core.http_post, the client the broker uses.
local mcp = require "mcp_server"
local cjson = require "cjson"

local available, why = mcp.available()

local SEARCH = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":{"query":"hi"}}}'
local ACCEPT_BOTH = "application/json, text/event-stream"

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- POSTs with node's fetch (independent of our core); returns status, body.
local function node_post(url, headers, body)
  local js = [[
    const [url, headers, body] = process.argv.slice(1);
    fetch(url, { method: 'POST', headers: JSON.parse(headers), body })
      .then(async (r) => { process.stdout.write(r.status + '\n' + await r.text()); })
      .catch((e) => { process.stdout.write('0\n' + e); });
  ]]
  local cmd = string.format("env -u LD_PRELOAD node -e %s %s %s %s", shell_quote(js), shell_quote(url),
    shell_quote(cjson.encode(headers)), shell_quote(body))
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  p:close()
  local status, rest = out:match("^(%d+)\n(.*)$")
  return tonumber(status), rest
end

describe("MCP server fixture", function()
  if not available then
    pending("skipped: " .. why)
    return
  end

  local server
  after_each(function()
    if server then server:stop() end
    server = nil
  end)

  it("prints its port and pid and serves /mcp on loopback", function()
    server = mcp.start()
    assert.is_number(server.port)
    assert.is_number(server.pid)
    assert.matches("^http://127%.0%.0%.1:%d+/mcp$", server.url)
  end)

  it("answers a tools/call of search with a JSON-RPC result (node fetch)", function()
    server = mcp.start()
    local status, body = node_post(server.url,
      { ["Content-Type"] = "application/json", Accept = ACCEPT_BOTH }, SEARCH)
    assert.equals(200, status)
    local msg = cjson.decode(body)
    assert.equals("2.0", msg.jsonrpc)
    assert.equals(1, msg.id)
    assert.equals("results for hi", msg.result.content[1].text)
  end)

  it("answers 406 when Accept does not list text/event-stream", function()
    server = mcp.start()
    local status = node_post(server.url,
      { ["Content-Type"] = "application/json", Accept = "application/json" }, SEARCH)
    assert.equals(406, status)
  end)

  it("declares delete as a real tool (so the broker must refuse it itself)", function()
    server = mcp.start()
    local status, body = node_post(server.url,
      { ["Content-Type"] = "application/json", Accept = ACCEPT_BOTH },
      '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"delete","arguments":{"id":"x"}}}')
    assert.equals(200, status)
    assert.equals("deleted x", cjson.decode(body).result.content[1].text)
  end)

  it("with require_key answers 401 to a wrong key and logs the Authorization it got", function()
    server = mcp.start{ require_key = "real-mcp-key" }
    local hdrs = { ["Content-Type"] = "application/json", Accept = ACCEPT_BOTH }
    hdrs.Authorization = "Bearer wrong"
    assert.equals(401, (node_post(server.url, hdrs, SEARCH)))
    hdrs.Authorization = "Bearer real-mcp-key"
    assert.equals(200, (node_post(server.url, hdrs, SEARCH)))
    local status, body = node_post(server.base .. "/__log", {}, "")
    assert.equals(200, status)
    local log = cjson.decode(body)
    assert.equals(2, #log)
    assert.equals("Bearer wrong", log[1].authorization)
    assert.equals("Bearer real-mcp-key", log[2].authorization)
    assert.equals("search", log[2].body.params.name)
    assert.equals(SEARCH, log[2].raw)
  end)

  it("answers a tools/call of search through core.http_post", function()
    local core = require "sandbox.core"
    local async = require "sandbox.async"
    assert.is_function(core.http_post, "sandbox.core has no http_post yet (core/upstream.c)")
    server = mcp.start{ require_key = "k1" }
    local res = async.run(function()
      return async.await(function(resume)
        core.http_post{
          url = server.url,
          headers = {
            "Content-Type: application/json",
            "Accept: " .. ACCEPT_BOTH,
            "Authorization: Bearer k1",
          },
          body = SEARCH,
          allow_http = true,
          timeout_ms = 10000,
          on_done = resume,
        }
      end)
    end)
    assert.is_table(res)
    assert.is_true(res.ok, "http_post failed: " .. tostring(res.error) .. " " .. tostring(res.status))
    assert.equals(200, res.status)
    local msg = cjson.decode(res.body)
    assert.equals(1, msg.id)
    assert.equals("results for hi", msg.result.content[1].text)
    local log = async.run(function() return server:log() end)
    assert.equals(1, #log)
    assert.equals("Bearer k1", log[1].authorization)
    assert.equals(ACCEPT_BOTH, log[1].headers.accept)
    assert.is_nil(log[1].headers["user-agent"])
  end)
end)
