-- upstream_spec.lua: core.http_post against a real fake upstream over
-- loopback (spec/fixtures/fake_upstream.mjs): exactly what goes out
-- (spec/broker.md 7.2), how replies are judged (9.8, 11.3), cancellation,
-- proxy/netrc environment, and TLS through the trusted seams.
local core = require "sandbox.core"
local async = require "sandbox.async"
local fake = require "fake_upstream"

local post = fake.post
local KEY = "real-model-key"
local DEFAULT_BODY = '{"id":"c1","object":"chat.completion","choices":[{"index":0,' ..
  '"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'
local MIB = 1048576

local function tmpdir()
  local p = assert(io.popen("mktemp -d /tmp/sbx-upstream-spec.XXXXXX")):read("l")
  assert(p and #p > 0)
  return p
end

-- Header pairs sorted by name, for comparing exact header sets.
local function sorted(headers)
  local copy = {}
  for i, h in ipairs(headers) do copy[i] = { h[1], h[2] } end
  table.sort(copy, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  return copy
end

local function names(headers)
  local out = {}
  for _, h in ipairs(headers) do out[h[1]] = true end
  return out
end

-- Polls the fake's log until pred(log) holds or ms pass; returns the log.
local function wait_log(up, pred, ms)
  local deadline = core.now() + (ms or 2000)
  local log = up:log()
  while not pred(log) and core.now() < deadline do
    async.sleep(25)
    log = up:log()
  end
  return log
end

describe("core.http_post", function()
  local up

  setup(function() up = fake.start() end)
  teardown(function() up:stop() end)

  local function base(path, extra)
    local o = { url = up:url(path), allow_http = true, timeout_ms = 5000 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return o
  end

  describe("content type", function()
    it("reports the final answer's Content-Type, trimmed, only when asked (opts.content_type)", function()
      async.run(function()
        up:reset()
        up:script({ { status = 200, headers = { ["Content-Type"] = "  Text/Event-Stream; charset=utf-8 " }, body = "data: {}\n\n" } })
        local res = post(base("/sse", { content_type = true, body = "{}" }))
        assert.same({ ok = true, status = 200, body = "data: {}\n\n", content_type = "Text/Event-Stream; charset=utf-8" }, res)
        up:script({ { status = 200, body = "{}" } })
        res = post(base("/none", { content_type = true, body = "{}" }))
        assert.equal("", res.content_type)
        res = post(base("/default", { body = "{}" }))
        assert.is_nil(res.content_type)
      end)
    end)
  end)

  describe("request", function()
    it("sends exactly the configured URL, the caller's headers, Host, Content-Length and the body", function()
      async.run(function()
        up:reset()
        local body = '{"model":"test-model","messages":[]}'
        local res = post(base("/v1/chat/completions?api-version=2024-06-01&x=%2Fy", {
          headers = { "Content-Type: application/json", "Accept: application/json",
                      "Authorization: Bearer " .. KEY },
          body = body,
        }))
        assert.same({ ok = true, status = 200, body = DEFAULT_BODY }, res)
        local log = up:log()
        assert.equal(1, #log)
        assert.equal("POST", log[1].method)
        assert.equal("/v1/chat/completions?api-version=2024-06-01&x=%2Fy", log[1].url)
        assert.same(sorted({
          { "accept", "application/json" },
          { "authorization", "Bearer " .. KEY },
          { "content-length", tostring(#body) },
          { "content-type", "application/json" },
          { "host", "127.0.0.1:" .. up.port },
        }), sorted(log[1].headers))
        assert.equal(body, log[1].body)
      end)
    end)

    it("sends no Accept, Content-Type, User-Agent or Expect of its own when given no headers", function()
      async.run(function()
        up:reset()
        assert.is_true(post(base("/x", { body = "abc" })).ok)
        local log = up:log()
        assert.same(sorted({ { "content-length", "3" }, { "host", "127.0.0.1:" .. up.port } }),
                    sorted(log[1].headers))
      end)
    end)

    it("sends a 300 KB binary body byte for byte with no Expect, User-Agent or Accept-Encoding", function()
      async.run(function()
        up:reset()
        local chunk = "\0\1\2\255\254 \r\n{\"k\":\"\u{e9}\u{1F600}\"}"
        local body = string.rep(chunk, 300000 // #chunk + 1):sub(1, 300000)
        local res = post(base("/big", { headers = { "Content-Type: application/json" }, body = body }))
        assert.is_true(res.ok)
        local log = up:log()
        assert.equal(300000, log[1].body_length)
        assert.is_true(log[1].body == body)
        local n = names(log[1].headers)
        assert.is_nil(n["expect"])
        assert.is_nil(n["user-agent"])
        assert.is_nil(n["accept-encoding"])
        assert.is_nil(n["accept"])
        assert.is_nil(n["transfer-encoding"])
        assert.same(sorted({ { "content-length", "300000" }, { "content-type", "application/json" },
                             { "host", "127.0.0.1:" .. up.port } }), sorted(log[1].headers))
      end)
    end)

    it("suppresses Expect: 100-continue also for a body over 1 MiB", function()
      async.run(function()
        up:reset()
        local body = string.rep("0123456789abcdef", 2 * MIB // 16)
        local res = post(base("/huge", { headers = { "Content-Type: application/json" }, body = body }))
        assert.is_true(res.ok)
        local log = up:log()
        assert.equal(2 * MIB, log[1].body_length)
        assert.is_true(log[1].body == body)
        assert.same(sorted({ { "content-length", tostring(2 * MIB) }, { "content-type", "application/json" },
                             { "host", "127.0.0.1:" .. up.port } }), sorted(log[1].headers))
      end)
    end)

    it("passes the MCP accept list through unchanged and sends an empty body as Content-Length 0", function()
      async.run(function()
        up:reset()
        assert.is_true(post(base("/rpc", { headers = { "Accept: application/json, text/event-stream" } })).ok)
        local log = up:log()
        assert.same(sorted({ { "accept", "application/json, text/event-stream" },
                             { "content-length", "0" }, { "host", "127.0.0.1:" .. up.port } }),
                    sorted(log[1].headers))
        assert.equal("", log[1].body)
      end)
    end)

    it("does not normalise the path", function()
      async.run(function()
        up:reset()
        assert.is_true(post(base("/v1/./a/../chat")).ok)
        assert.equal("/v1/./a/../chat", up:log()[1].url)
      end)
    end)

    it("raises on malformed options and on headers the client owns", function()
      local function bad(o)
        local opts = { url = "https://models.example/", timeout_ms = 1000, on_done = function() end }
        for k, v in pairs(o) do opts[k] = v end
        return pcall(core.http_post, opts)
      end
      for _, line in ipairs({ "Host: evil.example", "Content-Length: 5", "Expect: 100-continue",
                              "Transfer-Encoding: chunked", "connection: close", "NoColon",
                              ": empty-name", "X-A: b\r\nX-Injected: 1", "X-A: b\0c", "X-Empty:",
                              "Bad Name: v" }) do
        assert.is_false((bad({ headers = { line } })), line)
      end
      assert.is_false((bad({ timeout_ms = 0 })))
      assert.is_false((bad({ timeout_ms = 600001 })))
      assert.is_false((bad({ timeout_ms = "1000" })))
      assert.is_false((bad({ timeout_ms = false })))
      assert.is_false((bad({ max_body = -1 })))
      assert.is_false((bad({ url = 42 })))
      assert.is_false((bad({ url = "" })))
      assert.is_false((bad({ on_done = "x" })))
      assert.is_false((bad({ allow_http = "yes" })))
      assert.is_false((bad({ connect_to = "a:1:b:2" })))
      assert.is_false((bad({ headers = { 42 } })))
      assert.is_false(pcall(core.http_post, { url = "https://models.example/", on_done = print }))
    end)
  end)

  describe("response", function()
    it("accepts any 2xx: ok, status and the body, nothing else", function()
      async.run(function()
        up:reset()
        up:script({
          { status = 201, headers = { ["Content-Type"] = "application/json" }, body = "[1,2]" },
          { status = 202, body = "" },
          { status = 299, body = "odd but 2xx" },
        })
        assert.same({ ok = true, status = 201, body = "[1,2]" }, post(base("/a")))
        assert.same({ ok = true, status = 202, body = "" }, post(base("/b")))
        assert.same({ ok = true, status = 299, body = "odd but 2xx" }, post(base("/c")))
      end)
    end)

    it("hands back an SSE body as it is (judging it is the route's job)", function()
      async.run(function()
        up:reset()
        local sse = 'event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n\n'
        up:script({ { status = 200, headers = { ["Content-Type"] = "text/event-stream" }, chunks = { sse } } })
        assert.same({ ok = true, status = 200, body = sse }, post(base("/rpc")))
      end)
    end)

    it("passes on no response header (Set-Cookie, Authorization, Connection)", function()
      async.run(function()
        up:reset()
        up:script({ { status = 200, body = "{}", headers = {
          ["Set-Cookie"] = { "a=1; Path=/", "b=" .. KEY }, ["Authorization"] = "Bearer " .. KEY,
          ["Connection"] = "close", ["X-RateLimit-Remaining"] = "3" } } })
        assert.same({ ok = true, status = 200, body = "{}" }, post(base("/h")))
      end)
    end)

    it("turns a 401 whose body is the key into error 'status' without the body", function()
      async.run(function()
        up:reset()
        up:script({ { status = 401, body = KEY, headers = { ["Content-Type"] = "text/plain" } } })
        local res = post(base("/v1/chat/completions"))
        assert.same({ ok = false, error = "status", status = 401 }, res)
      end)
    end)

    it("stops at a non-2xx status line without waiting for its body", function()
      async.run(function()
        up:reset()
        -- the body's first chunk comes 2 s after the head: returning before it
        -- (with a wide margin for a loaded machine) is not waiting for it
        up:script({ { status = 500, chunks = { KEY, KEY, KEY, KEY, KEY }, chunk_delay_ms = 2000 } })
        local t0 = core.now()
        local res = post(base("/err"))
        local took = core.now() - t0
        assert.same({ ok = false, error = "status", status = 500 }, res)
        assert.is_true(took < 1500, "took " .. took)
      end)
    end)

    it("does not follow a 307: error 'status', the Location server never contacted", function()
      local other = fake.start()
      async.run(function()
        up:reset()
        other:reset()
        up:script({ { status = 307, headers = { Location = other:url("/steal") }, body = "" } })
        local res = post(base("/v1/chat/completions", { headers = { "Authorization: Bearer " .. KEY } }))
        assert.same({ ok = false, error = "status", status = 307 }, res)
        async.sleep(100)
        assert.same({}, other:log())
        assert.equal(1, #up:log())
      end)
      other:stop()
    end)

    it("treats 1xx interim responses as nothing: only the final status counts", function()
      async.run(function()
        up:reset()
        up:script({
          { continue = true, status = 200, body = "after-100" },
          { early_hints = { link = "</x>; rel=preload", ["content-encoding"] = "gzip" },
            status = 200, body = "after-103" },
          { continue = true, status = 401, body = KEY },
        })
        assert.same({ ok = true, status = 200, body = "after-100" }, post(base("/a")))
        assert.same({ ok = true, status = 200, body = "after-103" }, post(base("/b")))
        assert.same({ ok = false, error = "status", status = 401 }, post(base("/c")))
      end)
    end)

    it("refuses a Content-Encoding other than identity with error 'encoding'", function()
      async.run(function()
        up:reset()
        up:script({
          { status = 200, headers = { ["Content-Encoding"] = "gzip" }, body = "\31\139\8\0" },
          { status = 200, headers = { ["Content-Encoding"] = "br" }, body = "x" },
          { status = 200, headers = { ["Content-Encoding"] = "" }, body = "x" },
          { status = 200, headers = { ["Content-Encoding"] = "identity" }, body = "plain" },
          { status = 200, headers = { ["Content-Encoding"] = " IDENTITY " }, body = "plain2" },
        })
        assert.same({ ok = false, error = "encoding", status = 200 }, post(base("/a")))
        assert.same({ ok = false, error = "encoding", status = 200 }, post(base("/b")))
        assert.same({ ok = false, error = "encoding", status = 200 }, post(base("/c")))
        assert.same({ ok = true, status = 200, body = "plain" }, post(base("/d")))
        assert.same({ ok = true, status = 200, body = "plain2" }, post(base("/e")))
      end)
    end)

    it("accepts exactly 1 MiB and refuses one byte more with error 'too large'", function()
      async.run(function()
        up:reset()
        up:script({
          { status = 200, body = "x", ["repeat"] = MIB },
          { status = 200, body = "x", ["repeat"] = MIB + 1 },
          { status = 200, chunks = { string.rep("y", 600000), string.rep("y", 600000) } },
        })
        local res = post(base("/exact"))
        assert.is_true(res.ok)
        assert.equal(MIB, #res.body)
        assert.is_true(res.body == string.rep("x", MIB))
        assert.same({ ok = false, error = "too large", status = 200 }, post(base("/over")))
        assert.same({ ok = false, error = "too large", status = 200 }, post(base("/chunked")))
      end)
    end)

    it("honours a smaller max_body", function()
      async.run(function()
        up:reset()
        up:script({ { status = 200, body = "0123456789" }, { status = 200, body = "0123456789A" },
                    { status = 200, body = "" }, { status = 200, body = "z" } })
        assert.same({ ok = true, status = 200, body = "0123456789" }, post(base("/a", { max_body = 10 })))
        assert.same({ ok = false, error = "too large", status = 200 }, post(base("/b", { max_body = 10 })))
        assert.same({ ok = true, status = 200, body = "" }, post(base("/c", { max_body = 0 })))
        assert.same({ ok = false, error = "too large", status = 200 }, post(base("/d", { max_body = 0 })))
      end)
    end)

    it("gives up after timeout_ms with error 'timeout'", function()
      async.run(function()
        up:reset()
        up:script({ { delay_ms = 3000, status = 200, body = "late" } })
        local t0 = core.now()
        local res = post(base("/slow", { timeout_ms = 300 }))
        local took = core.now() - t0
        assert.same({ ok = false, error = "timeout", cause = "timed out" }, res)
        assert.is_true(took >= 290 and took < 2000, "took " .. took)
      end)
    end)

    it("times out a body that trickles in, keeping the status it saw", function()
      async.run(function()
        up:reset()
        up:script({ { status = 200, chunks = { "a", "b", "c", "d" }, chunk_delay_ms = 400 } })
        assert.same({ ok = false, error = "timeout", status = 200, cause = "timed out" }, post(base("/trickle", { timeout_ms = 500 })))
      end)
    end)

    -- The policy is sbx__curl_harden (core/curl_loop.c), shared with safe
    -- fetch: HTTP09_ALLOWED 0 (libcurl's default too since 7.66).
    it("refuses an HTTP/0.9 reply (bytes without a status line): error 'network', no body", function()
      async.run(function()
        up:reset()
        up:script({ { raw = '{"choices":[]}' } })
        assert.same({ ok = false, error = "network", cause = "not an HTTP/1.1 reply" }, post(base("/v09")))
        assert.equal(1, #up:log())
      end)
    end)

    it("reports a refused connection as error 'network'", function()
      local gone = fake.start()
      local port = gone.port
      gone:stop()
      async.run(function()
        local res = post({ url = "http://127.0.0.1:" .. port .. "/", allow_http = true, timeout_ms = 3000 })
        assert.same({ ok = false, error = "network", cause = "connection refused" }, res)
      end)
    end)

    it("refuses http:// without allow_http, other schemes and userinfo, contacting no one", function()
      async.run(function()
        up:reset()
        local refused = "URL scheme refused (https only, http only where allowed)"
        assert.same({ ok = false, error = "network", cause = refused }, post({ url = up:url("/plain"), timeout_ms = 3000 }))
        assert.same({ ok = false, error = "network", cause = refused },
                    post({ url = up:url("/plain"):gsub("^http", "ftp"), allow_http = true, timeout_ms = 3000 }))
        assert.same({ ok = false, error = "network", cause = refused },
                    post({ url = "file:///etc/passwd", allow_http = true, timeout_ms = 3000 }))
        assert.same({ ok = false, error = "network", cause = "Login denied" },
                    post({ url = up:url("/u"):gsub("//", "//user:pass@"), allow_http = true, timeout_ms = 3000 }))
        async.sleep(50)
        assert.same({}, up:log())
      end)
    end)
  end)

  describe("lifetime", function()
    it("never calls on_done synchronously, and calls it exactly once", function()
      async.run(function()
        up:reset()
        local calls, returned = 0, false
        async.await(function(resume)
          core.http_post(base("/once", { on_done = function(res)
            calls = calls + 1
            assert(returned, "on_done ran inside http_post")
            resume(res)
          end }))
          returned = true
        end)
        async.sleep(100)
        assert.equal(1, calls)
      end)
    end)

    it("cancel(): on_done never runs and the server sees the connection aborted", function()
      async.run(function()
        up:reset()
        up:script({ { delay_ms = 1500, status = 200, body = "never" } })
        local called = false
        local req = core.http_post(base("/cancel", { on_done = function() called = true end }))
        local log = wait_log(up, function(l) return #l == 1 end)
        assert.equal(1, #log)
        assert.is_false(log[1].aborted)
        req:cancel()
        req:cancel()
        log = wait_log(up, function(l) return l[1].aborted end)
        assert.is_true(log[1].aborted)
        async.sleep(1700)
        assert.is_false(called)
      end)
    end)

    it("cancel() before the loop turns sends nothing and calls nothing", function()
      async.run(function()
        up:reset()
        local called = false
        local req = core.http_post(base("/early", { on_done = function() called = true end }))
        req:cancel()
        async.sleep(200)
        assert.is_false(called)
        assert.same({}, up:log())
      end)
    end)

    it("cancel() is safe inside on_done, of the finished request and of another", function()
      async.run(function()
        up:reset()
        up:script({ { delay_ms = 800, status = 200, body = "slow" }, { status = 200, body = "fast" } })
        local calls, slow_called = 0, false
        local fast
        local slow = core.http_post(base("/slow", { on_done = function() slow_called = true end }))
        assert.equal(1, #wait_log(up, function(l) return #l == 1 end))
        local res = async.await(function(resume)
          fast = core.http_post(base("/fast", { on_done = function(r)
            calls = calls + 1
            fast:cancel()
            slow:cancel()
            slow:cancel()
            resume(r)
          end }))
        end)
        assert.same({ ok = true, status = 200, body = "fast" }, res)
        async.sleep(1000)
        assert.equal(1, calls)
        assert.is_false(slow_called)
        assert.is_true(up:log()[1].aborted)
      end)
    end)

    it("keeps going when the request object is collected", function()
      async.run(function()
        up:reset()
        up:script({ { delay_ms = 200, status = 200, body = "kept" } })
        local res = async.await(function(resume)
          core.http_post(base("/gc", { on_done = resume }))
          collectgarbage("collect")
          collectgarbage("collect")
        end)
        assert.same({ ok = true, status = 200, body = "kept" }, res)
      end)
    end)

    it("leaves nothing active on the loop once its requests are over", function()
      async.run(function()
        up:reset()
        assert.is_true(post(base("/idle")).ok)
      end)
      assert.is_false(core.run("nowait"))
      local req = core.http_post(base("/idle2", { on_done = function() end }))
      assert.is_true(core.run("nowait"))
      req:cancel()
      assert.is_false(core.run("nowait"))
    end)

    it("runs many requests at once, each finishing once", function()
      async.run(function()
        up:reset()
        local tasks, n = {}, 24
        for i = 1, n do
          tasks[i] = async.spawn(function() return post(base("/p" .. i, { body = tostring(i) })) end)
        end
        for i = 1, n do
          local ok, res = async.wait(tasks[i])
          assert.is_true(ok)
          assert.same({ ok = true, status = 200, body = DEFAULT_BODY }, res)
        end
        local log = up:log()
        assert.equal(n, #log)
        local seen = {}
        for _, e in ipairs(log) do seen[e.url] = e.body end
        for i = 1, n do assert.equal(tostring(i), seen["/p" .. i]) end
      end)
    end)
  end)

  describe("environment", function()
    it("ignores proxy variables and ~/.netrc", function()
      local dir = tmpdir()
      local netrc = assert(io.open(dir .. "/.netrc", "w"))
      netrc:write("machine 127.0.0.1 login netrc-user password netrc-secret\ndefault login d password d\n")
      netrc:close()
      local child = dir .. "/child.lua"
      local f = assert(io.open(child, "w"))
      f:write(([[
package.path = "lua/?.lua;spec/support/?.lua;" .. package.path
package.cpath = %q
local async = require "sandbox.async"
local fake = require "fake_upstream"
local res = async.run(function()
  return fake.post({ url = %q, allow_http = true, timeout_ms = 3000, body = "via-env" })
end)
io.write(tostring(res.ok), " ", tostring(res.status), " ", tostring(res.error), "\n")
io.stdout:flush()
]]):format(package.cpath, up:url("/env")))
      f:close()
      local dead = "http://127.0.0.1:9"
      local cmd = ("env HOME=%s http_proxy=%s HTTP_PROXY=%s https_proxy=%s HTTPS_PROXY=%s " ..
                   "ALL_PROXY=%s all_proxy=%s NO_PROXY= no_proxy= lua5.4 %s"):format(
                   dir, dead, dead, dead, dead, dead, dead, child)
      async.run(function() up:reset() end)
      local p = assert(io.popen(cmd))
      local out = p:read("a")
      p:close()
      os.execute("rm -rf '" .. dir .. "'")
      assert.equal("true 200 nil\n", out)
      async.run(function()
        local log = up:log()
        assert.equal(1, #log)
        assert.equal("/env", log[1].url)
        assert.equal("via-env", log[1].body)
        assert.is_nil(names(log[1].headers)["authorization"])
      end)
    end)
  end)
end)

describe("core.http_post over TLS", function()
  local dir, tls, up

  setup(function()
    dir = tmpdir()
    tls = fake.make_ca(dir)
    up = fake.start({ tls = tls })
  end)
  teardown(function()
    up:stop()
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("reaches https://models.example through connect_to and the test CA", function()
    async.run(function()
      up:reset()
      local url = up:url("/v1/chat/completions")
      assert.equal("https://models.example:" .. up.port .. "/v1/chat/completions", url)
      local res = post({ url = url, timeout_ms = 5000, cainfo = tls.ca,
                         connect_to = { "models.example:" .. up.port .. ":127.0.0.1:" .. up.port },
                         headers = { "Content-Type: application/json" }, body = "{}" })
      assert.same({ ok = true, status = 200, body = DEFAULT_BODY }, res)
      local log = up:log()
      assert.equal(1, #log)
      assert.same(sorted({ { "content-length", "2" }, { "content-type", "application/json" },
                           { "host", "models.example:" .. up.port } }), sorted(log[1].headers))
    end)
  end)

  it("refuses the certificate without the test CA: error 'network', nothing served", function()
    async.run(function()
      up:reset()
      local res = post({ url = up:url("/v1/chat/completions"), timeout_ms = 5000,
                         connect_to = { "models.example:" .. up.port .. ":127.0.0.1:" .. up.port } })
      assert.same({ ok = false, error = "network", cause = "TLS certificate verification failed" }, res)
      assert.same({}, up:log())
    end)
  end)

  it("refuses a certificate for another name even with the test CA", function()
    async.run(function()
      up:reset()
      local res = post({ url = "https://api.example:" .. up.port .. "/", timeout_ms = 5000, cainfo = tls.ca,
                         connect_to = { "api.example:" .. up.port .. ":127.0.0.1:" .. up.port } })
      assert.same({ ok = false, error = "network", cause = "TLS certificate verification failed" }, res)
      assert.same({}, up:log())
    end)
  end)
end)

describe("core.http_post to an upstream that speaks only TLS 1.1", function()
  local dir, tls, old

  setup(function()
    dir = tmpdir()
    tls = fake.make_ca(dir)
    old = fake.start({ tls = tls, tls_max = "TLSv1.1" })
  end)
  teardown(function()
    old:stop()
    os.execute("rm -rf '" .. dir .. "'")
  end)

  -- openssl's own client, told to go down to TLS 1.1: the fake answers that
  -- handshake and refuses a TLS 1.2 one.
  local function handshake(flag)
    return os.execute(string.format(
      "env -u LD_PRELOAD openssl s_client -connect 127.0.0.1:%d %s -cipher 'DEFAULT@SECLEVEL=0' </dev/null >/dev/null 2>&1",
      old.port, flag))
  end

  -- The policy is sbx__curl_harden (core/curl_loop.c), shared with safe
  -- fetch: CURLOPT_SSLVERSION TLSv1_2 at least (Debian's OpenSSL security
  -- level refuses TLS 1.1 by default as well).
  it("refuses the handshake: error 'network', the fake reached by nothing", function()
    assert.is_true(handshake("-tls1_1"), "the fake does not speak TLS 1.1")
    assert.is_falsy(handshake("-tls1_2"), "the fake speaks TLS 1.2")
    async.run(function()
      local res = post({ url = old:url("/v1/chat/completions"), timeout_ms = 5000, cainfo = tls.ca,
                         connect_to = { "models.example:" .. old.port .. ":127.0.0.1:" .. old.port },
                         headers = { "Content-Type: application/json" }, body = "{}" })
      assert.same({ ok = false, error = "network", cause = "TLS handshake failed" }, res)
    end)
  end)
end)
