-- precheck_broker_spec.lua: the precheck broker (shared/spec/precheck.md 5,
-- behaviours 1-10 of section 9) on a real Unix socket, forwarding to real
-- MCP servers built on the official @modelcontextprotocol/sdk
-- (spec/fixtures/mcp_server.mjs): one answering JSON, one answering a single
-- SSE event; /raw answers canned bytes where the SDK cannot write them.
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local mcp = require "mcp_server"
local P = require "precheck_harness"

local run = async.run
local json_server, sse_server
local ok_mcp, why_mcp = mcp.available()

local HEALTH_TOOLS = { "garmin-login", "garmin-get-hrv", "echo", "slow", "whoami", "reflect" }

setup(function()
  if not ok_mcp then return end
  json_server = mcp.start {}
  sse_server = mcp.start { sse = true }
end)

teardown(function()
  if json_server then json_server:stop() end
  if sse_server then sse_server:stop() end
end)

local function each_upstream(fn)
  for _, u in ipairs { { "JSON", json_server }, { "SSE", sse_server } } do fn(u[1], u[2]) end
end

-- Runs fn(b, path, sig) on a broker for `servers`, then stops it.
local function with_broker(servers, opts, fn)
  return run(function()
    local b, path, dir, sig = P.broker(servers, opts)
    local ok, err = pcall(fn, b, path, sig)
    P.stop(b, dir)
    if not ok then error(err, 0) end
  end)
end

local function mcp_calls(server, before)
  local n = 0
  for i, entry in ipairs(P.log(server)) do
    if i > before and entry.path:find("^/mcp") then n = n + 1 end
  end
  return n
end

local function header(reply, name)
  for _, h in ipairs(reply.headers) do
    if h[1]:lower() == name then return h[2] end
  end
end

local function only_listener_headers(reply)
  local names = {}
  for _, h in ipairs(reply.headers) do names[#names + 1] = h[1] end
  assert.same({ "Content-Type", "Content-Length", "Connection" }, names)
end

describe("precheck broker: forwarding (precheck.md 5.2)", function()
  if not ok_mcp then pending(why_mcp) return end

  it("forwards a granted tools/call with the host token and answers 200, for a JSON and an SSE upstream (behaviour 1)", function()
    each_upstream(function(kind, server)
      with_broker({ P.server("health", server.url, HEALTH_TOOLS) }, {}, function(_, path)
        local before = #P.log(server)
        local r = P.call(path, "health", "garmin-get-hrv", '{"date":"2026-10-04"}')
        assert.equal(200, r.status, kind)
        assert.equal("application/json;charset=utf-8", header(r, "content-type"))
        only_listener_headers(r)
        local msg = assert(json.decode(r.body))
        assert.equal("2.0", msg.jsonrpc)
        local value = json.decode(msg.result.content[1].text)
        assert.equal("2026-10-04", value.date, kind)
        assert.equal(22, value.hrv)
        local seen = P.log(server)[before + 1]
        assert.equal("Bearer " .. P.TOKEN, seen.authorization)
        -- exactly the rebuilt body, no guest id
        assert.equal('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"garmin-get-hrv","arguments":{"date":"2026-10-04"}}}', seen.raw)
        assert.equal("application/json, text/event-stream", seen.headers.accept)
        assert.is_nil(seen.headers["user-agent"])
        assert.is_nil(seen.headers["accept-encoding"])
      end)
    end)
  end)

  it("sends no authorization when the server has no token, and {} when arguments are absent", function()
    with_broker({ P.server("health", json_server.url, HEALTH_TOOLS, false) }, {}, function(_, path)
      local before = #P.log(json_server)
      local r = P.post(path, "/mcp/health", '{"method":"tools/call","params":{"name":"garmin-login"}}')
      assert.equal(200, r.status)
      local seen = P.log(json_server)[before + 1]
      assert.equal(json.null, seen.authorization == nil and json.null or seen.authorization)
      assert.equal('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"garmin-login","arguments":{}}}', seen.raw)
    end)
  end)
end)

describe("precheck broker: order of checks (precheck.md 5.1)", function()
  if not ok_mcp then pending(why_mcp) return end

  it("with maxCalls 3: unknown server, query, Bearer stolen and /model are 404; an ungranted tool and tools/list 403; then 200, then 429; upstream reached once (behaviour 2)", function()
    with_broker({ P.server("health", json_server.url, { "garmin-get-hrv" }) }, { maxCalls = 3 }, function(b, path)
      local before = #P.log(json_server)
      local body = P.call_body("garmin-get-hrv", '{"date":"2026-10-04"}')
      for _, route in ipairs { "/mcp/nope", "/mcp/health?", "/mcp/health?x=1", "/model", "/mcp/health/", "/mcp/%68ealth" } do
        local r = P.post(path, route, body)
        assert.equal(404, r.status, route)
        assert.equal("not found", r.body)
      end
      local stolen = P.post(path, "/mcp/health", body, {
        { "Host", "broker" }, { "Content-Type", "application/json" }, { "Authorization", "Bearer stolen" } })
      assert.equal(404, stolen.status)
      assert.equal(3, b:stats().budget)
      local r = P.call(path, "health", "garmin-login")
      assert.equal(403, r.status)
      assert.equal("MCP method or tool refused", r.body)
      r = P.post(path, "/mcp/health", '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}')
      assert.equal(403, r.status)
      assert.equal(1, b:stats().budget)
      assert.equal(200, P.post(path, "/mcp/health", body).status)
      r = P.post(path, "/mcp/health", body)
      assert.equal(429, r.status)
      assert.equal("call budget exhausted", r.body)
      assert.equal(1, mcp_calls(json_server, before))
    end)
  end)

  it("refuses a repeated or unknown header with 403 forbidden header and a missing host with 403 forbidden host, spending nothing (behaviour 7)", function()
    with_broker({ P.server("health", json_server.url, HEALTH_TOOLS) }, { maxCalls = 2 }, function(b, path)
      local body = P.call_body("garmin-login")
      local cases = {
        { { { "Host", "broker" }, { "Accept", "a" }, { "accept", "b" } }, 403, "forbidden header" },
        { { { "Host", "broker" }, { "X-Extra", "1" } }, 403, "forbidden header" },
        { { { "Host", "broker" }, { "Connection", "close" } }, 403, "forbidden header" },
        { { { "Content-Type", "application/json" } }, 403, "forbidden host" },
        { { { "Host", "broker:80" } }, 403, "forbidden host" },
      }
      for _, c in ipairs(cases) do
        local r = P.post(path, "/mcp/health", body, c[1])
        assert.equal(c[2], r.status)
        assert.equal(c[3], r.body)
      end
      assert.equal(2, b:stats().budget)
    end)
  end)

  it("answers 410 run ended on a routed call once the run signal aborted (behaviour 8)", function()
    with_broker({ P.server("health", json_server.url, HEALTH_TOOLS) }, {}, function(b, path, sig)
      sig:abort("precheck script timed out")
      local r = P.call(path, "health", "garmin-login")
      assert.equal(410, r.status)
      assert.equal("run ended", r.body)
      assert.equal(404, P.call(path, "google", "send").status)
      assert.equal(16, b:stats().budget)
    end)
  end)

  it("answers 502 and spends a call for a body that is not JSON, over 64 KiB, or deeper than 64 (behaviour 9)", function()
    with_broker({ P.server("health", json_server.url, HEALTH_TOOLS) }, { maxCalls = 5 }, function(b, path)
      local deep = string.rep("[", 65) .. string.rep("]", 65)
      local big = '{"method":"tools/call","params":{"name":"echo","arguments":{"text":"' .. string.rep("a", 65536) .. '"}}}'
      for _, body in ipairs { "not json", big, deep, "" } do
        local r = P.post(path, "/mcp/health", body)
        assert.equal(502, r.status)
        assert.equal("broker call failed", r.body)
      end
      assert.equal(1, b:stats().budget)
    end)
  end)

  it("refuses a second call while the first is pending with 409 without spending; the first and a later third get 200 (behaviour 6)", function()
    with_broker({ P.server("health", json_server.url, HEALTH_TOOLS) }, { maxCalls = 2 }, function(b, path)
      local first = async.spawn(P.call, path, "health", "slow", '{"ms":1500}')
      require("spec_fs").wait_for(function() return b:stats().in_flight end, "the first call in flight")
      local second = P.call(path, "health", "garmin-login")
      assert.equal(409, second.status)
      assert.equal("one call at a time", second.body)
      assert.equal(1, b:stats().budget)
      local ok, r = async.wait(first)
      assert.is_true(ok)
      assert.equal(200, r.status)
      assert.equal(200, P.call(path, "health", "garmin-login").status)
      assert.equal(0, b:stats().budget)
    end)
  end)
end)

describe("precheck broker: credential reflection (precheck.md 5.3)", function()
  if not ok_mcp then pending(why_mcp) return end

  it("refuses an upstream that echoes the token plainly with 502 (behaviour 3)", function()
    each_upstream(function(kind, server)
      with_broker({ P.server("health", server.url, HEALTH_TOOLS) }, {}, function(_, path)
        for _, c in ipairs { { "whoami", "{}" }, { "reflect", '{"form":"plain"}' } } do
          local r = P.call(path, "health", c[1], c[2])
          assert.equal(502, r.status, kind .. " " .. c[1])
          assert.equal("credential reflected", r.body)
        end
      end)
    end)
  end)

  it("refuses the token JSON-escaped in the raw text, inside JSON text in a string, base64-encoded, or as an object key, over JSON and SSE (behaviour 4)", function()
    each_upstream(function(kind, server)
      with_broker({ P.server("health", server.url, HEALTH_TOOLS), P.server("raw", server.raw_url, { "x" }) }, {},
        function(_, path)
          for _, form in ipairs { "nested", "base64", "key" } do
            local r = P.call(path, "health", "reflect", '{"form":"' .. form .. '"}')
            assert.equal(502, r.status, kind .. " " .. form)
            assert.equal("credential reflected", r.body)
          end
          local escaped = '{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"sk\\u002dlive\\u002d123"}]}}'
          assert.is_nil(escaped:find(P.TOKEN, 1, true))
          server:queue_raw { status = 200, contentType = "application/json", body = escaped }
          server:queue_raw { status = 200, contentType = "text/event-stream", body = "event: message\ndata: " .. escaped .. "\n\n" }
          for _ = 1, 2 do
            local r = P.call(path, "raw", "x")
            assert.equal(502, r.status, kind .. " escaped")
            assert.equal("credential reflected", r.body)
          end
        end)
    end)
  end)

  it("counts nesting beyond 64 levels (strings decoded one level deeper) as carrying the token", function()
    run(function()
      local filter = core.reflect_filter(P.TOKEN)
      local m = require "sandbox.precheck._message"
      local function message(levels)   -- a string of JSON text `levels` arrays deep, at depth 4
        local text = string.rep("[", levels) .. string.rep("]", levels)
        return json.decode('{"result":{"content":[{"text":' .. json.encode(text) .. '}]}}')
      end
      assert.is_false(m.reflects(filter, message(50)))
      assert.is_true(m.reflects(filter, message(60)))
      assert.is_false(m.reflects(filter, json.decode('{"result":{"text":"{\\"a\\":1}","n":1,"b":true}}')))
      assert.is_true(m.reflects(filter, json.decode('{"result":{"text":"\\"sk\\\\u002dlive\\\\u002d123\\""}}')))
      assert.is_false(m.reflects(filter, json.decode('{"result":{"text":"{not json sk-live"}}')))
    end)
  end)
end)

describe("precheck broker: upstream answers (precheck.md 5.2)", function()
  if not ok_mcp then pending(why_mcp) return end

  it("reassembles one SSE event split over two data: lines and returns it with 200 unchanged (behaviour 5)", function()
    with_broker({ P.server("raw", sse_server.raw_url, { "x" }) }, {}, function(_, path)
      sse_server:queue_raw { status = 200, contentType = "Text/Event-Stream; charset=utf-8",
        body = 'event: message\r\ndata: {"jsonrpc":"2.0","id":1,\r\ndata:  "result":{"content":[{"type":"text","text":"two lines"}]}}\r\n\r\n' }
      local r = P.call(path, "raw", "x")
      assert.equal(200, r.status)
      assert.equal('{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"two lines"}]}}', r.body)
    end)
  end)

  it("takes the last SSE event whose data is a JSON object, and refuses a stream with none", function()
    with_broker({ P.server("raw", sse_server.raw_url, { "x" }) }, {}, function(_, path)
      sse_server:queue_raw { status = 200, contentType = "text/event-stream",
        body = 'data: {"jsonrpc":"2.0","method":"notifications/progress"}\n\ndata: [1]\n\n: comment\ndata: {"jsonrpc":"2.0","id":1,"result":{}}' }
      assert.equal('{"jsonrpc":"2.0","id":1,"result":{}}', P.call(path, "raw", "x").body)
      sse_server:queue_raw { status = 200, contentType = "text/event-stream", body = "data: [1]\n\ndata: nope\n\n" }
      local r = P.call(path, "raw", "x")
      assert.equal(502, r.status)
      assert.equal("upstream returned no JSON-RPC message", r.body)
      sse_server:queue_raw { status = 200, contentType = "application/json", body = "data: {}\n\n" }
      assert.equal("upstream returned no JSON-RPC message", P.call(path, "raw", "x").body)
    end)
  end)

  it("answers 502 for a redirecting or non-2xx upstream, and no upstream header reaches the client (behaviour 10)", function()
    with_broker({ P.server("raw", json_server.raw_url, { "x" }) }, {}, function(_, path)
      local before = #P.log(json_server)
      json_server:queue_raw { status = 302, headers = { Location = json_server.url, ["Set-Cookie"] = "s=1" }, body = "" }
      json_server:queue_raw { status = 500, headers = { ["Set-Cookie"] = "s=1", ["X-Upstream"] = "1" },
        contentType = "application/json", body = '{"jsonrpc":"2.0","id":1,"result":{}}' }
      json_server:queue_raw { status = 401, contentType = "application/json", body = '{"error":"' .. P.TOKEN .. '"}' }
      local r = P.call(path, "raw", "x")
      assert.equal(502, r.status)
      assert.equal("broker call failed", r.body)
      only_listener_headers(r)
      for _ = 1, 2 do
        r = P.call(path, "raw", "x")
        assert.equal(502, r.status)
        assert.equal("upstream refused", r.body)
        only_listener_headers(r)
        assert.is_nil(r.raw:find("s=1", 1, true))
      end
      -- the redirect was not followed: three requests, all to /raw
      local log = P.log(json_server)
      assert.equal(before + 3, #log)
      for i = before + 1, #log do assert.equal("/raw", log[i].path) end
    end)
  end)

  it("answers 502 when the token hook raises, returns a non-string or a value holding CR, LF or NUL", function()
    local hooks = {
      function() error("vault down") end, function() return 7 end, function() return nil end,
      function() return "a\r\nX-Injected: 1" end, function() return "a\0b" end,
    }
    for _, hook in ipairs(hooks) do
      with_broker({ { name = "health", url = json_server.url, tools = HEALTH_TOOLS, token = hook } }, {}, function(_, path)
        local before = #P.log(json_server)
        local r = P.call(path, "health", "garmin-login")
        assert.equal(502, r.status)
        assert.equal("broker call failed", r.body)
        assert.equal(0, mcp_calls(json_server, before))
      end)
    end
  end)

  it("hands the token hook the run's scope and the call's signal", function()
    local seen
    local hook = function(scope, ctx)
      seen = { scope = scope, aborted = ctx.signal.aborted, has_on_abort = type(ctx.signal.on_abort) == "function" }
      return ""
    end
    with_broker({ { name = "health", url = json_server.url, tools = HEALTH_TOOLS, token = hook } },
      { scope = { channel = "c1", target = "t1", tier = "member" } }, function(_, path)
        assert.equal(200, P.call(path, "health", "garmin-login").status)
        assert.same({ channel = "c1", target = "t1", tier = "member" }, seen.scope)
        assert.is_false(seen.aborted)
        assert.is_true(seen.has_on_abort)
      end)
  end)

  it("uses the fetchImpl seam instead of libcurl when given", function()
    local got
    local fetch = function(req, sig)
      got = { req = req, aborted = sig.aborted }
      return { status = 200, contentType = "application/json", body = '{"jsonrpc":"2.0","id":1,"result":{"ok":true}}' }
    end
    with_broker({ P.server("health", "https://mcp.example/health?team=1", HEALTH_TOOLS) }, { fetchImpl = fetch }, function(_, path)
      local r = P.call(path, "health", "garmin-login")
      assert.equal(200, r.status)
      assert.equal('{"jsonrpc":"2.0","id":1,"result":{"ok":true}}', r.body)
      assert.equal("https://mcp.example/health?team=1", got.req.url)
      assert.equal("Bearer " .. P.TOKEN, got.req.headers.authorization)
      assert.equal("application/json", got.req.headers["content-type"])
      assert.is_false(got.aborted)
    end)
  end)
end)
