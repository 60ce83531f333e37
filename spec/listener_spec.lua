-- listener_spec.lua: core.broker_listen over the real Unix socket (spec/broker.md
-- sections 2.2 step 4, 3, 5 steps 0-12, 6 and 7.1; items 12 and 21-39 of
-- "Behaviours the specs must cover"), driven byte for byte with
-- spec/support/unix_request.lua. Replies are compared as exact bytes.
--
-- Slow specs use the real 10 s and 60 s deadlines: busted --exclude-tags=slow.
local async = require "sandbox.async"
local core = require "sandbox.core"
local lfs = require "lfs"
local spec_fs = require "spec_fs"
local unix_request = require "unix_request"

local BODY = '{"messages":[]}'
local DUMMY = "Bearer sandbox-dummy-key"
local ROUTES = { "/model", "/tools/clock", "/tools/bash", "/mcp/public" }
local REASONS = { [200] = "OK", [400] = "Bad Request", [403] = "Forbidden", [404] = "Not Found",
                  [410] = "Gone", [429] = "Too Many Requests", [502] = "Bad Gateway" }

-- The exact bytes of a reply (section 3: three headers, nothing else).
local function reply(status, body, ctype)
  ctype = ctype or (status == 200 and "application/json;charset=utf-8" or "text/plain;charset=utf-8")
  return ("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s")
    :format(status, REASONS[status], ctype, #body, body)
end

local BAD_REQUEST = reply(400, "bad request")
local INVALID_URL = reply(400, "invalid URL")
local NOT_FOUND = reply(404, "not found")
local FORBIDDEN_HEADER = reply(403, "forbidden header")
local FORBIDDEN_CREDENTIAL = reply(403, "forbidden credential")
local FORBIDDEN_HOST = reply(403, "forbidden host")
local TURN_ENDED = reply(410, "turn ended")
local BUSY = reply(429, "call budget exhausted or busy")
local CALL_FAILED = reply(502, "broker call failed")
local INVALID_INPUT = reply(400, "invalid input")
local OK = reply(200, '{"ok":true}')

-- A request as bytes. o.headers replaces the standard set (the worker's four
-- headers of section 14); o.add appends lines; o.drop removes names.
local function request(o)
  o = o or {}
  local body = o.body or BODY
  local headers = o.headers or {
    "Host: broker", "Content-Type: application/json",
    "Content-Length: " .. #body, "Authorization: " .. DUMMY,
  }
  local lines = {}
  for _, h in ipairs(headers) do
    local name = h:match("^([^:]*):")
    if not (o.drop and name and o.drop[name:lower()]) then lines[#lines + 1] = h end
  end
  for _, h in ipairs(o.add or {}) do lines[#lines + 1] = h end
  local line = (o.method or "POST") .. " " .. (o.target or "/model") .. " " .. (o.version or "HTTP/1.1")
  return line .. "\r\n" .. table.concat(lines, "\r\n") .. (#lines > 0 and "\r\n" or "") .. "\r\n" .. body
end

local sh, mode_of = spec_fs.sh, spec_fs.mode

-- Inside a task: one exchange; returns the result table of unix_request.
local function exchange(path, bytes, opts)
  return async.await(function(resume)
    assert(unix_request(path, bytes, opts or { timeout_ms = 5000 }, resume))
  end)
end

-- Inside a task: the reply bytes (asserting the exchange itself worked).
local function send(path, bytes, opts)
  local res = exchange(path, bytes, opts)
  assert(res.ok, "unix_request failed: " .. tostring(res.error))
  return res.data
end

-- Starts an exchange without waiting; returns handle and a result box.
local function start_request(path, bytes, opts)
  local box = { done = false }
  box.handle = assert(unix_request(path, bytes, opts, function(res)
    box.done, box.res, box.at = true, res, core.now()
  end))
  return box
end

local function wait_until(pred, ms)
  local t0 = core.now()
  while not pred() do
    if core.now() - t0 > (ms or 5000) then return false end
    async.sleep(5)
  end
  return true
end

describe("core.broker_listen", function()
  local dir, path, listener, calls

  -- A listener on a fresh socket; on_call replies 200 {"ok":true} unless
  -- opts.on_call is given. Every call is kept in `calls`.
  local function listen(opts)
    opts = opts or {}
    local o = { path = path, routes = opts.routes or ROUTES, max_calls = opts.max_calls or 48 }
    for k, v in pairs(opts) do if k ~= "routes" then o[k] = v end end
    local user = opts.on_call
    o.on_call = function(call)
      calls[#calls + 1] = call
      if user then return user(call) end
      call:reply(200, '{"ok":true}')
    end
    listener = assert(core.broker_listen(o))
    return listener
  end

  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(lfs.mkdir(dir))
    assert(os.execute("chmod 0700 '" .. dir .. "'"))
    path = dir .. "/broker.sock"
    listener, calls = nil, {}
  end)

  after_each(function()
    if listener then listener:stop() end
    for _ = 1, 5 do core.run("nowait") end
    os.remove(path)
    lfs.rmdir(dir)
  end)

  describe("socket", function()
    it("serves 200 on a 0600 socket inside a 0700 dir and restores the umask", function()
      local probe = dir .. "/before"
      io.open(probe, "w"):close()
      local before = mode_of(probe)
      os.remove(probe)
      listen()
      assert.are.equal("700", mode_of(dir))
      assert.are.equal("600", mode_of(path))
      io.open(probe, "w"):close()
      assert.are.equal(before, mode_of(probe))
      os.remove(probe)
      async.run(function()
        assert.are.equal(OK, send(path, request()))
      end)
      assert.are.equal("/model", calls[1]:route())
      local body = calls[1]:body()
      assert.are.equal(core.json_object_mt, getmetatable(body))
      assert.are.equal(core.json_array_mt, getmetatable(body.messages))
    end)

    it("refuses a socket path over 100 bytes", function()
      local long = dir .. "/" .. ("s"):rep(100 - #dir)
      assert.is_true(#long == 101)
      local l, err = core.broker_listen { path = long, routes = ROUTES, on_call = function() end }
      assert.is_nil(l)
      assert.are.equal("broker socket path too long", err)
      assert.is_nil(lfs.attributes(long))
    end)

    it("fails without touching an existing file at the path", function()
      local f = io.open(path, "w")
      f:write("keep")
      f:close()
      local l, err = core.broker_listen { path = path, routes = ROUTES, on_call = function() end }
      assert.is_nil(l)
      assert.matches("^cannot listen on the broker socket", err)
      core.run("nowait")
      assert.are.equal("keep", io.open(path):read("a"))
    end)

    it("stop() closes and unlinks the socket, and is idempotent", function()
      listen()
      assert.is_not_nil(lfs.attributes(path))
      listener:stop()
      listener:stop()
      assert.is_nil(lfs.attributes(path))
      async.run(function()
        local res = exchange(path, request())
        assert.are.same({ ok = false, error = "connect", data = "" }, res)
      end)
    end)
  end)

  describe("listener (section 3)", function()
    it("closes the 8 connections over the cap of 16 at once and writes nothing (item 21)", function()
      listen()
      async.run(function()
        local t0 = core.now()
        local boxes = {}
        for i = 1, 24 do boxes[i] = start_request(path, "", { keep_open = true, timeout_ms = 5000 }) end
        assert.is_true(wait_until(function()
          local n = 0
          for _, b in ipairs(boxes) do if b.done then n = n + 1 end end
          return n >= 8
        end, 1000))
        async.sleep(50)
        local early = 0
        for _, b in ipairs(boxes) do
          if b.done then
            early = early + 1
            assert.are.same({ ok = true, data = "" }, b.res)
            assert.is_true(b.at - t0 < 250, "closed after " .. (b.at - t0) .. " ms")
          end
        end
        assert.are.equal(8, early)
        assert.are.equal(16, listener:stats().connections)
        listener:stop()
        assert.is_true(wait_until(function()
          for _, b in ipairs(boxes) do if not b.done then return false end end
          return true
        end, 1000))
        for _, b in ipairs(boxes) do assert.are.same({ ok = true, data = "" }, b.res) end
        assert.are.equal(0, listener:stats().connections)
      end)
    end)

    it("closes a connection without a complete head after the header deadline, no reply, no budget (item 22)", function()
      listen { header_timeout_ms = 300 }
      async.run(function()
        local t0 = core.now()
        local b = start_request(path, "POST /model HTTP/1.1\r\nHost: bro", { keep_open = true, timeout_ms = 5000 })
        async.sleep(150)
        assert.is_true(b.handle:write("ker\r\n"))     -- still dribbling: the deadline runs from accept
        assert.is_true(wait_until(function() return b.done end, 2000))
        assert.are.same({ ok = true, data = "" }, b.res)
        assert.is_true(b.at - t0 >= 290 and b.at - t0 < 1000, "closed after " .. (b.at - t0) .. " ms")
        assert.are.same({ connections = 0, budget = 48, in_flight = false, turn_ended = false }, listener:stats())
        assert.are.equal(0, #calls)
      end)
    end)

    it("uses the real 10 s header deadline #slow", function()
      listen()
      async.run(function()
        local t0 = core.now()
        local res = exchange(path, "POST /model HTTP/1.1\r\n", { keep_open = true, timeout_ms = 15000 })
        local dt = core.now() - t0
        assert.are.same({ ok = true, data = "" }, res)
        assert.is_true(dt >= 9900 and dt < 11000, "closed after " .. dt .. " ms")
        assert.are.equal(48, listener:stats().budget)
      end)
    end)

    it("closes a call still running after the request deadline: no reply, on_close fires, slot held (item 23)", function()
      local closed = 0
      listen {
        request_timeout_ms = 300,
        on_call = function(call) call:on_close(function() closed = closed + 1 end) end,
      }
      async.run(function()
        local t0 = core.now()
        local res = exchange(path, request(), { half_close = false, timeout_ms = 5000 })
        local dt = core.now() - t0
        assert.are.same({ ok = true, data = "" }, res)
        assert.is_true(dt >= 290 and dt < 1000, "closed after " .. dt .. " ms")
        assert.are.equal(1, closed)
        assert.is_false(calls[1]:is_open())
        assert.is_true(listener:stats().in_flight)
        assert.are.equal(BUSY, send(path, request()))
        assert.is_false(calls[1]:reply(200, "{}"))        -- the handler settles
        assert.is_false(listener:stats().in_flight)
        assert.are.equal(1, closed)
      end)
    end)

    it("closes a request whose body never completes at the request deadline, releasing the slot", function()
      listen { request_timeout_ms = 300 }
      async.run(function()
        local bytes = request()
        local res = exchange(path, bytes:sub(1, #bytes - 5), { half_close = false, timeout_ms = 5000 })
        assert.are.same({ ok = true, data = "" }, res)
        assert.is_true(wait_until(function() return listener:stats().connections == 0 end))
        assert.are.same({ connections = 0, budget = 47, in_flight = false, turn_ended = false }, listener:stats())
        assert.are.equal(0, #calls)
      end)
    end)

    it("uses the real 60 s request deadline #slow", function()
      local closed = false
      listen { on_call = function(call) call:on_close(function() closed = true end) end }
      async.run(function()
        local t0 = core.now()
        local res = exchange(path, request(), { half_close = false, timeout_ms = 65000 })
        local dt = core.now() - t0
        assert.are.same({ ok = true, data = "" }, res)
        assert.is_true(dt >= 59900 and dt < 61000, "closed after " .. dt .. " ms")
        assert.is_true(closed)
        calls[1]:reply(200, "{}")
      end)
    end)

    it("writes exactly status line, Content-Type, Content-Length and Connection: close, then closes (item 24)", function()
      listen()
      async.run(function()
        -- half_close=false: the EOF the client sees is the broker's close.
        assert.are.equal(OK, send(path, request(), { half_close = false }))
        assert.are.equal(NOT_FOUND, send(path, request { target = "/nope" }, { half_close = false }))
        assert.are.equal(
          "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain;charset=utf-8\r\nContent-Length: 9\r\n"
          .. "Connection: close\r\n\r\nnot found",
          send(path, request { method = "GET" }))
      end)
    end)

    it("gets a reply while still half-closed and the handler answers later", function()
      listen {
        on_call = function(call) core.timer(450, function() call:reply(200, '{"late":1}') end) end,
      }
      async.run(function()
        assert.are.equal(reply(200, '{"late":1}'), send(path, request()))   -- default: half-close
        assert.is_false(listener:stats().in_flight)
      end)
    end)
  end)

  describe("framing (step 0) and the target (step 1)", function()
    before_each(function() listen() end)

    local function padded(total, target)
      local base = request { target = target, add = { "User-Agent: " } }
      -- The head ends at the blank line; make it exactly `total` bytes.
      local head_len = #base - #BODY
      local pad = ("a"):rep(total - head_len)
      return request { target = target, add = { "User-Agent: " .. pad } }
    end

    it("accepts a head of exactly 16384 bytes and refuses 16385 with 400 (item 25)", function()
      async.run(function()
        local ok = padded(16384)
        assert.are.equal(16384, #ok - #BODY)
        assert.are.equal(OK, send(path, ok))
        local big = padded(16385)
        assert.are.equal(16385, #big - #BODY)
        assert.are.equal(BAD_REQUEST, send(path, big))
        -- No blank line at all within the limit.
        assert.are.equal(BAD_REQUEST, send(path, "POST /model HTTP/1.1\r\nUser-Agent: " .. ("a"):rep(17000)))
        assert.are.equal(47, listener:stats().budget)
      end)
    end)

    local malformed = {
      { "obsolete line folding", request { add = { "User-Agent: a", " folded" } } },
      { "folding with a tab", request { add = { "User-Agent: a", "\tfolded" } } },
      { "HTTP/2.0", request { version = "HTTP/2.0" } },
      { "HTTP/1.2", request { version = "HTTP/1.2" } },
      { "HTTP/0.9 (no version)", "POST /model\r\n\r\n" },
      { "lower-case version", request { version = "http/1.1" } },
      { "two spaces before the target", request { target = " /model" } },
      { "two spaces before the version", request { version = " HTTP/1.1" } },
      { "Content-Length +15", request { drop = { ["content-length"] = true }, add = { "Content-Length: +15" } } },
      { "Content-Length 0x0f", request { drop = { ["content-length"] = true }, add = { "Content-Length: 0x0f" } } },
      { "Content-Length 1 5", request { drop = { ["content-length"] = true }, add = { "Content-Length: 1 5" } } },
      { "Content-Length 15, 15", request { drop = { ["content-length"] = true }, add = { "Content-Length: 15, 15" } } },
      { "empty Content-Length", request { drop = { ["content-length"] = true }, add = { "Content-Length:" } } },
      { "Content-Length -1", request { drop = { ["content-length"] = true }, add = { "Content-Length: -1" } } },
      { "two Content-Length lines (item 39)", request { add = { "Content-Length: 15" } } },
      { "two Content-Length lines, other case", request { add = { "content-length: 15" } } },
      { "Content-Length with Transfer-Encoding", request { add = { "Transfer-Encoding: chunked" } } },
      { "Transfer-Encoding before Content-Length",
        request { headers = { "Host: broker", "Transfer-Encoding: identity", "Content-Length: 15" } } },
      { "space before the colon", request { headers = { "Host : broker", "Content-Length: 15" } } },
      { "header without colon", request { add = { "User-Agent" } } },
      { "empty header name", request { add = { ": x" } } },
      { "control byte in a value", request { add = { "User-Agent: a\1b" } } },
      { "bare LF line endings", "POST /model HTTP/1.1\nHost: broker\nContent-Length: 15\n\n" .. BODY },
      { "bare CR", request { add = { "User-Agent: a\rb" } } },
      { "unknown method token with a slash", request { method = "PO/ST" } },
      { "NUL in the target", request { target = "/mo\0del" } },
      { "DEL in the target", request { target = "/mo\127del" } },
      { "leading empty line", "\r\n" .. request() },
      { "0x80 in the target with a bad version", request { target = "/mo\128del", version = "HTTP/2.0" } },
    }
    for _, case in ipairs(malformed) do
      it("refuses " .. case[1] .. " with 400 bad request", function()
        async.run(function()
          assert.are.equal(BAD_REQUEST, send(path, case[2]))
          assert.are.equal(48, listener:stats().budget)
        end)
      end)
    end

    it("refuses a request-target byte of 0x80 or above with 400 invalid URL (item 26)", function()
      async.run(function()
        -- HT and FF pass http_parser's lenient URL table, so they are step 1 too.
        for _, t in ipairs { "/mo\128del", "/model\255", "/\195\169", "http://br\195\169ker/model",
                             "/mo\tdel", "/model\f" } do
          assert.are.equal(INVALID_URL, send(path, request { target = t }))
        end
        -- Step 1 comes before the method (2) and header (3) checks.
        assert.are.equal(INVALID_URL, send(path, request { method = "GET", target = "/\200", add = { "Cookie: a" } }))
        assert.are.equal(48, listener:stats().budget)
      end)
    end)
  end)

  describe("order of checks", function()
    it("gives 404 to a non-POST or a query even with forbidden headers (item 27)", function()
      listen()
      async.run(function()
        local bad = { "Cookie: a=b", "Connection: keep-alive", "X-Api-Key: k", "Expect: 100-continue" }
        for _, m in ipairs { "GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "post", "Post", "BREW" } do
          assert.are.equal(NOT_FOUND, send(path, request { method = m, add = bad }))
        end
        assert.are.equal(NOT_FOUND, send(path, request { target = "/model?x=1", add = bad }))
        assert.are.equal(NOT_FOUND, send(path, request { target = "/model#x", add = bad }))
        assert.are.equal(NOT_FOUND, send(path, request { target = "/model?", headers = { "Cookie: a" } }))
        assert.are.equal(0, #calls)
      end)
    end)

    it("gives 403 to a forbidden header on an unknown route (item 28)", function()
      listen()
      async.run(function()
        assert.are.equal(FORBIDDEN_HEADER, send(path, request { target = "/health", add = { "Cookie: a" } }))
        assert.are.equal(FORBIDDEN_CREDENTIAL,
          send(path, request { target = "/health", drop = { authorization = true }, add = { "Authorization: Bearer x" } }))
        assert.are.equal(FORBIDDEN_HOST, send(path, request { target = "/health", drop = { host = true } }))
      end)
    end)

    it("gives 404 to an unknown route and 410 to a known one after the turn ended, budget spent or not (item 29)", function()
      listen { max_calls = 1 }
      async.run(function()
        assert.are.equal(OK, send(path, request()))
        assert.are.equal(BUSY, send(path, request()))           -- budget spent
        listener:end_turn()
        assert.are.equal(NOT_FOUND, send(path, request { target = "/anthropic/v1/messages" }))
        assert.are.equal(TURN_ENDED, send(path, request()))
        assert.are.equal(TURN_ENDED, send(path, request { target = "/tools/clock" }))
        assert.are.equal(TURN_ENDED, send(path, request { target = "/mcp/public" }))
        assert.is_true(listener:stats().turn_ended)
      end)
    end)

    it("gives 410 before 429 while a call is in flight", function()
      listen { on_call = function() end }
      async.run(function()
        local held = start_request(path, request(), { timeout_ms = 5000 })
        assert.is_true(wait_until(function() return #calls == 1 end))
        assert.are.equal(BUSY, send(path, request()))
        listener:end_turn()
        assert.are.equal(TURN_ENDED, send(path, request()))
        calls[1]:reply(200, '{"ok":true}')
        assert.is_true(wait_until(function() return held.done end))
        assert.are.equal(OK, held.res.data)
      end)
    end)

    it("leaves the whole budget after any number of refusals at steps 0-8 (item 30)", function()
      listen { max_calls = 2 }
      async.run(function()
        local refusals = {
          { BAD_REQUEST, request { version = "HTTP/2.0" } },
          { INVALID_URL, request { target = "/\128" } },
          { NOT_FOUND, request { method = "GET" } },
          { FORBIDDEN_HEADER, request { add = { "Cookie: a" } } },
          { FORBIDDEN_CREDENTIAL, request { drop = { authorization = true }, add = { "Authorization: Bearer stolen" } } },
          { FORBIDDEN_HOST, request { drop = { host = true } } },
          { NOT_FOUND, request { target = "/nope" } },
        }
        for _ = 1, 5 do
          for _, r in ipairs(refusals) do assert.are.equal(r[1], send(path, r[2])) end
        end
        assert.are.same({ connections = listener:stats().connections, budget = 2, in_flight = false,
                          turn_ended = false }, listener:stats())
        assert.are.equal(OK, send(path, request()))
        assert.are.equal(OK, send(path, request()))
        assert.are.equal(BUSY, send(path, request()))            -- step 8 spends nothing either
        assert.are.equal(0, listener:stats().budget)
      end)
    end)
  end)

  describe("routing (section 6)", function()
    local function all_404(routes, targets)
      listen { routes = routes }
      async.run(function()
        for _, t in ipairs(targets) do
          assert.are.equal(NOT_FOUND, send(path, request { target = t }), t)
        end
        assert.are.equal(48, listener:stats().budget)
        assert.are.equal(0, #calls)
      end)
    end

    it("404s /, /health, /anthropic/v1/messages, /model/extra and a query (item 31)", function()
      all_404(ROUTES, { "/", "/health", "/anthropic/v1/messages", "/model/extra", "/model?url=https://guest.example" })
    end)

    it("404s unconfigured tools and an encoded configured one (item 32)", function()
      all_404({ "/model", "/tools/clock" }, { "/tools/bash", "/tools/read", "/tools/constructor" })
      listener:stop()
      listener = nil
      core.run("nowait")
      all_404(ROUTES, { "/tools/%62ash", "/tools/BASH", "/tools/bash/" })
    end)

    it("404s /mcp/private and /mcp/public/extra (item 33)", function()
      all_404(ROUTES, { "/mcp/private", "/mcp/public/extra", "/mcp/Public" })
    end)

    it("404s near-misses of /model without decoding or normalizing (item 34)", function()
      all_404(ROUTES, { "/model?", "/model#x", "/model/", "//model", "/x/../model", "/./model", "\\model",
                        "/%6dodel", "/tools/", "/mcp/", "http://broker/model", "*", "model", "/MODEL" })
    end)

    it("hands each configured route to on_call", function()
      listen()
      async.run(function()
        for _, r in ipairs(ROUTES) do assert.are.equal(OK, send(path, request { target = r })) end
      end)
      for i, r in ipairs(ROUTES) do assert.are.equal(r, calls[i]:route()) end
    end)
  end)

  describe("header policy (section 7.1)", function()
    it("403s each forbidden header, in any case, and never calls the handler (item 35)", function()
      listen()
      async.run(function()
        for _, h in ipairs { "Connection: close", "Keep-Alive: 5", "Proxy-Authenticate: x", "Proxy-Authorization: x",
                             "TE: trailers", "Trailer: x", "Transfer-Encoding: chunked", "Upgrade: websocket",
                             "X-Api-Key: k", "Cookie: a=b", "Forwarded: for=x", "X-Forwarded-Host: h",
                             "X-Forwarded-For: 1.2.3.4", "X-Forwarded-Proto: https", "connection: close",
                             "COOKIE: a" } do
          local bytes = h:match("^[Tt]ransfer") and request { drop = { ["content-length"] = true }, add = { h } }
            or request { add = { h } }
          assert.are.equal(FORBIDDEN_HEADER, send(path, bytes), h)
        end
        assert.are.equal(0, #calls)
        assert.are.equal(48, listener:stats().budget)
      end)
    end)

    it("403s an unknown header, and Expect: 100-continue without sending 100 Continue (item 36)", function()
      listen()
      async.run(function()
        for _, h in ipairs { "X-Provider-Token: t", "Origin: x", "X-Real-IP: 1", "Expect: 100-continue" } do
          assert.are.equal(FORBIDDEN_HEADER, send(path, request { add = { h } }), h)
        end
        -- The client waits for 100 Continue before sending its body.
        local head = request { add = { "Expect: 100-continue" } }
        head = head:sub(1, #head - #BODY)
        local res = exchange(path, head, { keep_open = true, timeout_ms = 5000 })
        assert.are.same({ ok = true, data = FORBIDDEN_HEADER }, res)
        assert.is_nil(res.data:find("100", 1, true))
      end)
    end)

    it("403s a wrong credential and accepts none (item 37)", function()
      listen()
      async.run(function()
        for _, v in ipairs { "Bearer stolen", "Bearer  sandbox-dummy-key", "bearer sandbox-dummy-key",
                             "Bearer sandbox-dummy-key x", "Basic c2FuZGJveA==", "" } do
          assert.are.equal(FORBIDDEN_CREDENTIAL,
            send(path, request { drop = { authorization = true }, add = { "Authorization: " .. v } }), v)
        end
        assert.are.equal(OK, send(path, request { drop = { authorization = true } }))
        assert.are.equal(OK, send(path, request { drop = { authorization = true },
                                                   add = { "authorization:   " .. DUMMY .. " \t" } }))
      end)
    end)

    it("403s a Host other than exactly broker, or none (item 38)", function()
      listen()
      async.run(function()
        for _, v in ipairs { "api.example", "broker:80", "Broker", "broker.", "" } do
          assert.are.equal(FORBIDDEN_HOST, send(path, request { drop = { host = true }, add = { "Host: " .. v } }), v)
        end
        assert.are.equal(FORBIDDEN_HOST, send(path, request { drop = { host = true } }))
        assert.are.equal(OK, send(path, request { drop = { host = true }, add = { "HOST:broker" } }))
      end)
    end)

    it("403s a header name sent twice, in any case (item 39)", function()
      listen()
      async.run(function()
        assert.are.equal(FORBIDDEN_HEADER, send(path, request { add = { "Authorization: " .. DUMMY } }))
        assert.are.equal(FORBIDDEN_HEADER, send(path, request { add = { "host: broker" } }))
        assert.are.equal(FORBIDDEN_HEADER, send(path, request { add = { "Accept: */*", "ACCEPT: */*" } }))
        assert.are.equal(BAD_REQUEST, send(path, request { add = { "Content-Length: 15" } }))
      end)
    end)

    it("accepts and ignores content-type, accept, accept-encoding and user-agent", function()
      listen()
      async.run(function()
        assert.are.equal(OK, send(path, request { drop = { ["content-type"] = true },
          add = { "Content-Type: text/html", "Accept: */*", "Accept-Encoding: gzip", "User-Agent: guest" } }))
      end)
    end)
  end)

  describe("body, steps 9-12", function()
    it("refuses a Content-Length over 262144 with 502 without reading the body, spending budget", function()
      listen()
      async.run(function()
        local head = request { drop = { ["content-length"] = true }, add = { "Content-Length: 262145" }, body = "" }
        -- No body is ever sent: the reply cannot wait for it.
        local res = exchange(path, head, { keep_open = true, timeout_ms = 5000 })
        assert.are.same({ ok = true, data = CALL_FAILED }, res)
        head = request { drop = { ["content-length"] = true }, add = { "Content-Length: 99999999999999999999" }, body = "" }
        assert.are.equal(CALL_FAILED, send(path, head, { keep_open = true, timeout_ms = 5000 }))
        assert.are.same({ connections = listener:stats().connections, budget = 46, in_flight = false,
                          turn_ended = false }, listener:stats())
        assert.are.equal(0, #calls)
      end)
    end)

    it("reads a body of exactly 262144 bytes", function()
      listen()
      async.run(function()
        local body = '{"s":"' .. ("x"):rep(262144 - 8) .. '"}'
        assert.are.equal(262144, #body)
        assert.are.equal(OK, send(path, request { body = body }))
      end)
      assert.are.equal(262144 - 8, #calls[1]:body().s)
    end)

    it("gives 502 to a client still sending an oversized body and lets it read the reply", function()
      listen()
      async.run(function()
        local body = '{"s":"' .. ("x"):rep(270000) .. '"}'
        assert.are.equal(CALL_FAILED, send(path, request { body = body }))
      end)
    end)

    it("502s a missing, empty or non-JSON body and 400s a non-object (steps 10-11)", function()
      listen()
      async.run(function()
        assert.are.equal(CALL_FAILED, send(path, request { drop = { ["content-length"] = true }, body = "" }))
        assert.are.equal(CALL_FAILED, send(path, request { body = "" }))
        for _, b in ipairs { "{", "{'a':1}", '{"a":1,"a":2}', '\239\187\191{}', '{"a":"\\ud800"}', "{} x",
                             ("["):rep(65) .. ("]"):rep(65), '{"a":"\255"}' } do
          assert.are.equal(CALL_FAILED, send(path, request { body = b }), b)
        end
        for _, b in ipairs { "[]", '"s"', "1", "true", "null", "[{}]" } do
          assert.are.equal(INVALID_INPUT, send(path, request { body = b }), b)
        end
        assert.are.equal(OK, send(path, request { body = " {} " }))
        assert.are.equal(48 - 17, listener:stats().budget)
        assert.is_false(listener:stats().in_flight)
        assert.are.equal(1, #calls)
      end)
    end)

    it("reads exactly Content-Length bytes and ignores what follows", function()
      listen()
      async.run(function()
        assert.are.equal(OK, send(path, request() .. "GARBAGE POST /model HTTP/1.1\r\n\r\n"))
      end)
      assert.are.same({ "messages" }, core.json_order[calls[1]:body()])
    end)

    it("reads a head and body dribbled in pieces", function()
      listen()
      async.run(function()
        local bytes = request()
        local b = start_request(path, bytes:sub(1, 10), { keep_open = true, timeout_ms = 5000 })
        for i = 11, #bytes, 7 do
          async.sleep(2)
          assert.is_true(b.handle:write(bytes:sub(i, i + 6)))
        end
        assert.is_true(wait_until(function() return b.done end))
        assert.are.same({ ok = true, data = OK }, b.res)
      end)
    end)

    it("502s a body cut short by a half-close", function()
      listen()
      async.run(function()
        local bytes = request()
        assert.are.equal(CALL_FAILED, send(path, bytes:sub(1, #bytes - 3)))
        assert.is_false(listener:stats().in_flight)
        assert.are.equal(47, listener:stats().budget)
      end)
    end)

    it("502s when the turn ends while the body is read (step 12)", function()
      listen()
      async.run(function()
        local bytes = request()
        local b = start_request(path, bytes:sub(1, #bytes - 4), { keep_open = true, timeout_ms = 5000 })
        assert.is_true(wait_until(function() return listener:stats().in_flight end))
        listener:end_turn()
        b.handle:write(bytes:sub(#bytes - 3))
        assert.is_true(wait_until(function() return b.done end))
        assert.are.same({ ok = true, data = CALL_FAILED }, b.res)
        assert.are.equal(0, #calls)
        assert.is_false(listener:stats().in_flight)
      end)
    end)

    it("429s a second call while one is in flight, at once (item 73)", function()
      listen { on_call = function(call) if #calls > 1 then call:reply(200, '{"ok":true}') end end }
      async.run(function()
        local held = start_request(path, request(), { timeout_ms = 5000 })
        assert.is_true(wait_until(function() return #calls == 1 end))
        local t0 = core.now()
        assert.are.equal(BUSY, send(path, request { target = "/tools/clock" }))
        assert.is_true(core.now() - t0 < 500)
        assert.is_true(calls[1]:reply(200, '{"ok":true}'))
        assert.is_false(calls[1]:reply(502, "again"))       -- second reply ignored
        assert.is_true(wait_until(function() return held.done end))
        assert.are.equal(OK, held.res.data)
        assert.are.equal(OK, send(path, request()))
        assert.are.equal(46, listener:stats().budget)
      end)
    end)

    it("keeps the slot when the client leaves until the handler replies; on_close fires once", function()
      local fired = 0
      listen { on_call = function(call)
        if #calls > 1 then return call:reply(200, '{"ok":true}') end
        call:on_close(function() fired = fired + 1 end)
      end }
      async.run(function()
        local held = start_request(path, request(), { keep_open = true, timeout_ms = 5000 })
        assert.is_true(wait_until(function() return #calls == 1 end))
        assert.is_true(calls[1]:is_open())
        held.handle:close()
        assert.is_true(wait_until(function() return fired == 1 end, 2000))
        assert.is_false(calls[1]:is_open())
        assert.is_true(listener:stats().in_flight)
        assert.are.equal(BUSY, send(path, request()))
        local late = 0
        calls[1]:on_close(function() late = late + 1 end)   -- registered late: runs at once
        assert.are.equal(1, late)
        assert.is_false(calls[1]:reply(200, "{}"))
        assert.is_false(listener:stats().in_flight)
        assert.are.equal(OK, send(path, request()))
        assert.are.equal(1, fired)
      end)
    end)

    it("fires on_close of pending calls on a forced stop", function()
      local fired = 0
      listen { on_call = function(call) call:on_close(function() fired = fired + 1 end) end }
      async.run(function()
        local held = start_request(path, request(), { timeout_ms = 5000 })
        assert.is_true(wait_until(function() return #calls == 1 end))
        listener:stop()
        assert.are.equal(1, fired)
        assert.is_true(wait_until(function() return held.done end))
        assert.are.same({ ok = true, data = "" }, held.res)
        assert.is_false(calls[1]:reply(200, "{}"))
        assert.is_false(listener:stats().in_flight)
      end)
    end)

    it("is safe to stop from inside on_call", function()
      listen { on_call = function(call) listener:stop(); call:reply(200, "{}") end }
      async.run(function()
        assert.are.same({ ok = true, data = "" }, exchange(path, request()))
        assert.is_nil(lfs.attributes(path))
      end)
    end)

    it("replies 502 and frees the slot when on_call raises", function()
      listen { on_call = function() error("boom") end }
      async.run(function()
        assert.are.equal(CALL_FAILED, send(path, request()))
        assert.is_false(listener:stats().in_flight)
        assert.are.equal(CALL_FAILED, send(path, request()))
      end)
    end)

    it("replies with the handler's status, body and content type, refusing a body over 1 MiB", function()
      local n = 0
      listen { on_call = function(call)
        n = n + 1
        if n == 1 then call:reply(400, "text/function model payload required")
        elseif n == 2 then call:reply(200, ("x"):rep(1048577))
        else call:reply(200, ("x"):rep(1048576)) end
      end }
      async.run(function()
        assert.are.equal(reply(400, "text/function model payload required"), send(path, request()))
        assert.are.equal(CALL_FAILED, send(path, request()))
        assert.are.equal(reply(200, ("x"):rep(1048576)), send(path, request()))
      end)
    end)

    it("the test_echo seam replies 200 with the body as read, without Lua", function()
      listener = assert(core.broker_listen { path = path, routes = ROUTES, test_echo = true })
      async.run(function()
        local body = '{"a": [1, 2] }'
        assert.are.equal(reply(200, body), send(path, request { body = body }))
        assert.are.equal(INVALID_INPUT, send(path, request { body = "[1]" }))
        assert.are.equal(46, listener:stats().budget)
      end)
    end)
  end)

  describe("unix_request (spec/support)", function()
    it("reports connect, timeout and too large, and close() silences the callback", function()
      listener = assert(core.broker_listen { path = path, routes = ROUTES, test_echo = true })
      async.run(function()
        assert.are.same({ ok = false, error = "connect", data = "" }, exchange(dir .. "/none.sock", "x"))
        assert.are.same({ ok = false, error = "timeout", data = "" },
          exchange(path, "POST", { keep_open = true, timeout_ms = 100 }))
        local res = exchange(path, request(), { max_bytes = 20 })
        assert.are.same({ ok = false, error = "too large", data = OK:sub(1, 20) }, res)
        local called = false
        local h = unix_request(path, "", { keep_open = true }, function() called = true end)
        h:close()
        h:close()
        async.sleep(50)
        assert.is_false(called)
        assert.is_nil(select(1, h:write("x")))
        local l, err = unix_request(("p"):rep(200), "", {}, function() end)
        assert.is_nil(l)
        assert.are.equal("invalid socket path", err)
      end)
    end)

    -- Regression (bench/broker_bench.lua under the generational collector):
    -- a task that stopped its listener and called core.run("nowait") re-entered
    -- uv_run from the last reply's read callback; the nested run freed that
    -- request's block (its handle already collected) under libuv's outer frame,
    -- and the next request crashed or never got its reply.
    it("answers every request across listener restarts while each handle is collected at once", function()
      async.run(function()
        for _ = 1, 4 do
          listener = assert(core.broker_listen { path = path, routes = ROUTES, test_echo = true })
          for _ = 1, 5 do
            local res = async.await(function(resume)
              unix_request(path, request(), { timeout_ms = 5000 }, resume)
              collectgarbage()                   -- the handle is gone before the reply
            end)
            assert.are.same({ ok = true, data = reply(200, BODY) }, res)
          end
          listener:stop()
          local ok, err = pcall(core.run, "nowait")   -- still inside the reply's callback
          assert.is_false(ok)
          assert.matches("already running", err)
          async.sleep(0)                         -- the way a task lets the loop turn
        end
      end)
    end)

    it("half-closes after the bytes unless told not to, and can shut down later", function()
      listener = assert(core.broker_listen { path = path, routes = ROUTES, test_echo = true })
      async.run(function()
        local bytes = request()
        local b = start_request(path, bytes:sub(1, #bytes - 1), { keep_open = true, timeout_ms = 5000 })
        async.sleep(20)
        b.handle:shutdown()                     -- body one byte short: read failure, 502
        assert.is_true(wait_until(function() return b.done end))
        assert.are.same({ ok = true, data = CALL_FAILED }, b.res)
      end)
    end)
  end)

  describe("argument checks", function()
    it("raises on wrong option types and timeouts above the defaults", function()
      local function bad(o)
        o.path = o.path or path
        o.routes = o.routes or ROUTES
        return not pcall(core.broker_listen, o)
      end
      assert.is_true(bad { on_call = 1 })
      assert.is_true(bad { routes = { 1 }, on_call = print })
      assert.is_true(bad { routes = { "" }, on_call = print })
      assert.is_true(bad { max_calls = 0, on_call = print })
      assert.is_true(bad { max_calls = 1001, on_call = print })
      assert.is_true(bad { header_timeout_ms = 10001, on_call = print })
      assert.is_true(bad { request_timeout_ms = 60001, on_call = print })
      assert.is_nil(lfs.attributes(path))
    end)
  end)
end)
