-- listener_stream_spec.lua: core.stream_listen, rich mode's stream listener
-- (spec/rich-mode.md section 8; behaviours 32-36), over the real Unix socket
-- with spec/support/unix_request.lua as the client (bytes as given, idle and
-- dribbled requests) and, for backpressure, spec/fixtures/slow_reader.mjs, a
-- real client that stops reading (spec/support/http_response.lua).
local async = require "sandbox.async"
local core = require "sandbox.core"
local lfs = require "lfs"
local http_response = require "http_response"
local spec_fs = require "spec_fs"
local unix_request = require "unix_request"

-- A request as bytes: o.method, o.target, o.headers (lines), o.body.
local function request(o)
  o = o or {}
  local body = o.body or ""
  local lines = o.headers or (#body > 0 and { "Content-Length: " .. #body } or {})
  local out = (o.method or "POST") .. " " .. (o.target or "/anthropic/v1/messages") .. " "
    .. (o.version or "HTTP/1.1") .. "\r\nHost: localhost\r\n"
  for _, l in ipairs(lines) do out = out .. l .. "\r\n" end
  return out .. "\r\n" .. body
end

local parse = http_response.parse

local function exchange(path, bytes, opts)
  return async.await(function(resume)
    assert(unix_request(path, bytes, opts or { timeout_ms = 5000 }, resume))
  end)
end

local function start_request(path, bytes, opts)
  local box = { done = false, chunks = {} }
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

describe("core.stream_listen (rich-mode.md 8)", function()
  local dir, path, listener, seen

  local function listen(opts)
    opts = opts or {}
    local o = { path = path }
    for k, v in pairs(opts) do o[k] = v end
    local user = opts.on_request
    o.on_request = function(req)
      seen[#seen + 1] = req
      if user then return user(req) end
      req:respond(200, { ["content-type"] = "text/plain; charset=utf-8" }, "ok")
    end
    listener = assert(core.stream_listen(o))
    return listener
  end

  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(lfs.mkdir(dir))
    assert(os.execute("chmod 0700 '" .. dir .. "'"))
    path = dir .. "/broker.sock"
    listener, seen = nil, {}
  end)

  after_each(function()
    if listener then listener:stop(true) end
    for _ = 1, 5 do core.run("nowait") end
    os.remove(path)
    lfs.rmdir(dir)
  end)

  describe("socket and request object", function()
    it("is mode 0600 and every response says connection: close (item 35)", function()
      listen()
      assert.are.equal("600", spec_fs.mode(path))
      async.run(function()
        local res = exchange(path, request { method = "GET", target = "/worker/config?x=1#f",
          headers = { "X-Custom:  spaced  ", "Accept: */*" } })
        assert.is_true(res.ok)
        assert.are.equal("HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\n"
          .. "content-length: 2\r\nconnection: close\r\n\r\nok", res.data)
      end)
      local req = seen[1]
      assert.are.equal("GET", req.method)
      assert.are.equal("/worker/config?x=1#f", req.target)
      assert.are.equal("HTTP/1.1", req.version)
      assert.are.same({ host = "localhost", ["x-custom"] = "spaced", accept = "*/*" }, req.headers)
      assert.is_false(req:is_open())
    end)

    it("refuses a path over 100 bytes and leaves an existing file alone", function()
      local long = dir .. "/" .. ("s"):rep(100 - #dir)
      local l, err, code = core.stream_listen { path = long, on_request = function() end }
      assert.is_nil(l)
      assert.are.equal("broker socket path too long", err)
      assert.are.equal("ENAMETOOLONG", code)
      local f = io.open(path, "w")
      f:write("keep")
      f:close()
      l, err, code = core.stream_listen { path = path, on_request = function() end }
      assert.is_nil(l)
      assert.matches("^cannot listen on the broker socket", err)
      assert.are.equal("EADDRINUSE", code)
      core.run("nowait")
      assert.are.equal("keep", io.open(path):read("a"))
    end)

    it("raises on wrong arguments", function()
      assert.has_error(function() core.stream_listen { path = path } end,
        "stream_listen: opts.on_request must be a function")
      assert.has_error(function()
        core.stream_listen { path = path, on_request = print, idle_ms = 120001 }
      end, "stream_listen: opts.idle_ms must be an integer in 1..120000")
      assert.has_error(function()
        core.stream_listen { path = path, on_request = print, max_connections = 17 }
      end, "stream_listen: opts.max_connections must be an integer in 1..16")
    end)
  end)

  describe("connections and heads", function()
    it("closes the 17th connection at once with no response (item 34)", function()
      listen()
      async.run(function()
        local boxes = {}
        for i = 1, 17 do boxes[i] = start_request(path, "", { keep_open = true, timeout_ms = 5000 }) end
        assert.is_true(wait_until(function()
          for _, b in ipairs(boxes) do if b.done then return true end end
        end, 2000))
        async.sleep(50)
        local done = 0
        for _, b in ipairs(boxes) do
          if b.done then
            done = done + 1
            assert.are.same({ ok = true, data = "" }, b.res)
          end
        end
        assert.are.equal(1, done)
        assert.are.equal(17, listener:stats().connections + done)
        for _, b in ipairs(boxes) do b.handle:close() end
      end)
      assert.are.equal(0, #seen)
    end)

    it("destroys a connection whose head is not complete by the header deadline, silently", function()
      listen { header_timeout_ms = 100 }
      async.run(function()
        local res = exchange(path, "POST /anthropic/v1/messages HTTP/1.1\r\nHost: x\r\n",
          { keep_open = true, timeout_ms = 5000 })
        assert.are.same({ ok = true, data = "" }, res)
      end)
      assert.are.equal(0, #seen)
    end)

    it("answers a repeated header name with 400 bad request before routing (item 36)", function()
      listen()
      async.run(function()
        for _, dup in ipairs({ { "X-A: 1", "x-a: 2" }, { "Content-Type: a", "CONTENT-TYPE: a" } }) do
          local res = exchange(path, request { method = "GET", headers = dup })
          assert.are.equal("HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
            .. "content-length: 11\r\nconnection: close\r\n\r\nbad request", res.data)
        end
      end)
      assert.are.equal(0, #seen)
    end)

    it("answers a malformed head with 400 and hands odd targets to Lua byte for byte", function()
      listen()
      async.run(function()
        for _, bad in ipairs({
          "GET /x HTTP/2.0\r\n\r\n", "GET  /x HTTP/1.1\r\n\r\n", "GET /x HTTP/1.1\nHost: a\n\n",
          "GET /x HTTP/1.1\r\nBad Name: 1\r\n\r\n", "GET /x HTTP/1.1\r\nA: 1\r\n folded\r\n\r\n",
          "POST /x HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
          "POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
          "GET /x HTTP/1.1\r\n" .. ("A" .. ("b"):rep(20000)) .. ": 1\r\n\r\n",
        }) do
          local res = exchange(path, bad)
          assert.are.equal(400, parse(res.data).status, bad:sub(1, 40))
        end
        local res = exchange(path, "GET /anthropic/./v1%2Fmessages/?beta=true HTTP/1.0\r\n\r\n")
        assert.are.equal(200, parse(res.data).status)
      end)
      assert.are.equal(1, #seen)
      assert.are.equal("/anthropic/./v1%2Fmessages/?beta=true", seen[1].target)
      assert.are.equal("HTTP/1.0", seen[1].version)
    end)
  end)

  describe("refusals C decides, as data", function()
    it("reports the 17th connection, a late head and a malformed or repeated one to on_refused", function()
      local refused = {}
      listen { header_timeout_ms = 150, on_refused = function(reason, status)
        refused[#refused + 1] = reason .. " " .. status
      end }
      async.run(function()
        local boxes = {}
        for i = 1, 17 do boxes[i] = start_request(path, "", { keep_open = true, timeout_ms = 5000 }) end
        assert.is_true(wait_until(function() return #refused >= 1 end, 2000))
        assert.are.same({ "connections 0" }, refused)
        -- the 16 held connections never complete a head: each one's deadline is reported
        assert.is_true(wait_until(function() return #refused >= 17 end, 3000))
        for _, b in ipairs(boxes) do b.handle:close() end
        for i = 2, 17 do assert.are.equal("header_deadline 0", refused[i]) end
        -- the torn-down connections leave the count once their handles closed
        assert.is_true(wait_until(function() return listener:stats().connections == 0 end, 3000))
        refused = {}
        exchange(path, request { method = "GET", headers = { "X-A: 1", "x-a: 2" } })
        exchange(path, "GET /x HTTP/1.1\r\nBad Name: 1\r\n\r\n")
        exchange(path, "POST /x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n")
        assert.are.equal(200, parse(exchange(path, request { method = "GET" }).data).status)
      end)
      assert.are.same({ "header 400", "header 400", "header 400" }, refused)
      assert.are.equal(1, #seen)
    end)

    it("raises on an on_refused that is not a function", function()
      assert.has_error(function()
        core.stream_listen { path = path, on_request = print, on_refused = "x" }
      end, "stream_listen: opts.on_refused must be a function")
    end)
  end)

  describe("request bodies", function()
    local results = {}
    local function read_with(limit)
      return function(req)
        req:read_body(limit, function(body, err, code)
          results[req] = { body = body, err = err, code = code }
          if body then req:respond(200, {}, body) else req:respond(400, {}, code) end
        end)
      end
    end

    it("reads a Content-Length body and a chunked one", function()
      listen { on_request = read_with(nil) }
      async.run(function()
        local body = ('{"a":"%s"}'):format(("x"):rep(200000))
        local res = parse(exchange(path, request { body = body }).data)
        assert.are.equal(200, res.status)
        assert.are.equal(body, res.body)
        res = parse(exchange(path, request { headers = { "Transfer-Encoding: chunked" },
          body = "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n" }).data)
        assert.are.equal("hello world", res.body)
        res = parse(exchange(path, request { method = "GET" }).data)
        assert.are.equal("", res.body)
      end)
    end)

    it("refuses a declared length over the limit unread, and a chunked body that grows over it", function()
      listen { max_body = 1000, on_request = read_with(nil) }
      async.run(function()
        local res = parse(exchange(path, "POST /x HTTP/1.1\r\nContent-Length: 1001\r\n\r\n",
          { keep_open = true, timeout_ms = 5000 }).data)
        assert.are.equal(400, res.status)
        assert.are.equal("EFBIG", res.body)
        res = parse(exchange(path, request { headers = { "Transfer-Encoding: chunked" },
          body = ("100\r\n" .. ("y"):rep(256) .. "\r\n"):rep(4) .. "0\r\n\r\n" }).data)
        assert.are.equal("EFBIG", res.body)
        res = parse(exchange(path, request { headers = { "Transfer-Encoding: chunked" },
          body = "zz\r\n" }).data)
        assert.are.equal("EBADMSG", res.body)
      end)
      assert.matches("^EFBIG: ", results[seen[1]].err)
    end)

    it("takes a smaller limit per read and never more than the listener's", function()
      listen { max_body = 1000, on_request = read_with(10) }
      async.run(function()
        assert.are.equal("EFBIG", parse(exchange(path, request { body = ("z"):rep(11) }).data).body)
        assert.are.equal(("z"):rep(10), parse(exchange(path, request { body = ("z"):rep(10) }).data).body)
      end)
      assert.has_error(function() seen[1]:read_body(1001, function() end) end)
      local ok, err, code = seen[1]:read_body(5, function() end)
      assert.is_nil(ok)
      assert.are.equal("ECONNABORTED", code)
    end)

    it("cuts a stalled request body once the silence limit passes (item 33)", function()
      local closed
      listen { idle_ms = 200, on_request = function(req)
        req:on_close(function(reason) closed = reason end)
        read_with(nil)(req)
      end }
      async.run(function()
        local res = exchange(path, "POST /x HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc",
          { keep_open = true, timeout_ms = 5000 })
        assert.are.same({ ok = true, data = "" }, res)
      end)
      assert.are.equal("idle", closed)
      assert.are.equal("ETIMEDOUT", results[seen[1]].code)
    end)

    it("keeps a body that dribbles in within the silence limit, past it in total", function()
      listen { idle_ms = 250, on_request = read_with(nil) }
      async.run(function()
        local box = start_request(path, "POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
          { keep_open = true, timeout_ms = 5000 })
        for i = 1, 5 do
          async.sleep(100)
          box.handle:write(tostring(i))
        end
        assert.is_true(wait_until(function() return box.done end))
        assert.are.equal("12345", parse(box.res.data).body)
      end)
    end)
  end)

  describe("streaming responses", function()
    it("streams chunks as they are released, with no total cap (item 32)", function()
      local first_at, done_at
      listen { idle_ms = 250, on_request = function(req)
        req:read_body(function()
          req:start(200, { ["content-type"] = "text/event-stream" })
          req:write("first")
          async.spawn(function()
            for _ = 1, 4 do
              async.sleep(150)
              req:write("x")
            end
            req:finish()
          end)
        end)
      end }
      async.run(function()
        local got = {}
        local stream = core.unix_stream(path, function(ev, data)
          if ev == "data" then
            got[#got + 1] = data
            if table.concat(got):find("first", 1, true) and not first_at then first_at = core.now() end
          else
            done_at = core.now()
          end
        end)
        stream:write(request { body = "{}" })
        assert.is_true(wait_until(function() return done_at ~= nil end))
        local res = parse(table.concat(got))
        assert.are.equal("chunked", res.headers["transfer-encoding"])
        assert.are.equal("close", res.headers.connection)
        assert.is_true(res.complete)
        assert.are.equal("firstxxxx", res.body)
        stream:close()
      end)
      assert.is_true(first_at < done_at)
    end)

    it("never runs the silence timer for GET, so a long poll outlives it", function()
      listen { idle_ms = 100, on_request = function(req)
        async.spawn(function()
          async.sleep(400)
          req:respond(408, { ["content-type"] = "text/plain; charset=utf-8" }, "Retry")
        end)
      end }
      async.run(function()
        local res = parse(exchange(path, request { method = "GET", target = "/worker/next" }).data)
        assert.are.equal(408, res.status)
        assert.are.equal("Retry", res.body)
      end)
    end)

    it("tears down a response that goes silent for the limit", function()
      local closed
      listen { idle_ms = 150, on_request = function(req)
        req:on_close(function(reason) closed = reason end)
        req:read_body(function()
          req:start(200, {})
          req:write("part")
        end)
      end }
      async.run(function()
        local res = parse(exchange(path, request { body = "{}" }).data)
        assert.are.equal("part", res.body)
        assert.is_false(res.complete)
      end)
      assert.are.equal("idle", closed)
    end)

    it("reports backpressure at 16 KiB queued and drains when the client reads", function()
      local report = {}
      listen { on_request = function(req)
        req:read_body(function()
          req:start(200, { ["content-type"] = "application/octet-stream" })
          local piece = ("p"):rep(65536)
          local total = 0
          repeat
            local ok, pressured = req:write(piece)
            assert.is_true(ok)
            total = total + #piece
          until pressured
          report.written, report.queued = total, req:queued()
          req:on_drain(function()
            report.drained = req:queued()
            req:write("end")
            req:finish()
            report.total = total + 3
          end)
        end)
      end }
      async.run(function()
        local reader = http_response.slow_reader(path, request { body = "{}" })
        assert.is_true(wait_until(function() return report.written ~= nil end))
        assert.is_nil(report.drained)
        assert.is_true(reader:read())
        local res = reader:wait()
        assert.are.equal(200, res.status)
        assert.is_true(res.complete)
        assert.are.equal(report.total, #res.body)
        assert.are.equal(("p"):rep(report.written) .. "end", res.body)
      end)
      assert.is_true(report.queued >= 16384)
      assert.is_true(report.drained < 16384)
    end)

    it("tells the handler when the client goes away mid-stream", function()
      local closed, write_after
      listen { on_request = function(req)
        req:on_close(function(reason)
          closed = reason
          write_after = req:write("late")
        end)
        req:read_body(function()
          req:start(200, {})
          req:write("one")
        end)
      end }
      async.run(function()
        local got = {}
        local stream
        stream = core.unix_stream(path, function(ev, data)
          if ev == "data" then got[#got + 1] = data; stream:close() end
        end)
        stream:write(request { body = "{}" })
        assert.is_true(wait_until(function() return closed ~= nil end))
      end)
      assert.are.equal("gone", closed)
      assert.is_false(write_after)
    end)

    it("answers a handler error with 400 before the head and destroys the connection after", function()
      listen { on_request = function(req)
        if req.target == "/before" then error("boom") end
        req:start(200, {})
        req:write("half")
        error("boom")
      end }
      async.run(function()
        local res = parse(exchange(path, request { method = "GET", target = "/before" }).data)
        assert.are.equal(400, res.status)
        assert.are.equal("bad request", res.body)
        res = parse(exchange(path, request { method = "GET", target = "/after" }).data)
        assert.are.equal("half", res.body)
        assert.is_false(res.complete)
      end)
    end)

    it("fail() is that same rule for a handler running as a task", function()
      listen { on_request = function(req)
        async.spawn(function()
          async.sleep(10)
          if req.target == "/after" then req:start(200, {}) end
          req:fail()
        end)
      end }
      async.run(function()
        assert.are.equal("bad request", parse(exchange(path, request { method = "GET" }).data).body)
        local res = parse(exchange(path, request { method = "GET", target = "/after" }).data)
        assert.are.equal(200, res.status)
        assert.is_false(res.complete)
      end)
    end)

    it("sends no body to HEAD and none for 204, and finishes each request once", function()
      local reasons = {}
      listen { on_request = function(req)
        req:on_close(function(r) reasons[#reasons + 1] = r end)
        if req.method == "HEAD" then req:respond(404, { ["content-type"] = "text/plain" }, "Not found")
        else req:respond(204, {}, "ignored") end
        assert.is_false(req:respond(200, {}, "twice"))
      end }
      async.run(function()
        local res = exchange(path, request { method = "HEAD", target = "/anthropic" })
        assert.are.equal("HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 9\r\n"
          .. "connection: close\r\n\r\n", res.data)
        res = exchange(path, request { method = "DELETE" })
        assert.are.equal("HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n", res.data)
      end)
      assert.are.same({ "finished", "finished" }, reasons)
    end)

    it("refuses response headers the listener owns or that could split the head", function()
      listen { on_request = function() end }
      async.run(function()
        local box = start_request(path, request { method = "GET" }, { timeout_ms = 5000 })
        assert.is_true(wait_until(function() return #seen == 1 end))
        local req = seen[1]
        assert.has_error(function() req:respond(200, { ["Content-Length"] = "1" }, "") end)
        assert.has_error(function() req:respond(200, { connection = "keep-alive" }, "") end)
        assert.has_error(function() req:respond(200, { ["x-a"] = "1\r\nx-b: 2" }, "") end)
        assert.has_error(function() req:respond(200, { ["bad name"] = "1" }, "") end)
        assert.has_error(function() req:respond(99, {}, "") end)
        assert.is_true(req:respond(200, { ["x-b"] = "2", ["x-a"] = "1" }, ""))
        assert.is_true(wait_until(function() return box.done end))
        assert.are.same({ "x-a", "x-b", "content-length", "connection" }, parse(box.res.data).order)
      end)
    end)
  end)

  describe("stop", function()
    it("stop(true) destroys every connection and unlinks the socket", function()
      local reasons = {}
      listen { on_request = function(req)
        req:on_close(function(r) reasons[#reasons + 1] = r end)
      end }
      async.run(function()
        local a = start_request(path, request { method = "GET" }, { timeout_ms = 5000 })
        local b = start_request(path, request { method = "GET" }, { timeout_ms = 5000 })
        assert.is_true(wait_until(function() return #seen == 2 end))
        listener:stop(true)
        assert.is_true(wait_until(function() return a.done and b.done end))
        assert.are.same({ ok = true, data = "" }, a.res)
        assert.is_nil(lfs.attributes(path))
      end)
      assert.are.same({ "stopped", "stopped" }, reasons)
    end)

    it("stop() keeps requests already handed to Lua and refuses new connections", function()
      listen { on_request = function() end }
      async.run(function()
        local a = start_request(path, request { method = "GET" }, { timeout_ms = 5000 })
        assert.is_true(wait_until(function() return #seen == 1 end))
        listener:stop()
        assert.is_true(seen[1]:respond(200, {}, "late"))
        assert.is_true(wait_until(function() return a.done end))
        assert.are.equal("late", parse(a.res.data).body)
        assert.are.equal("connect", exchange(path, request {}).error)
      end)
    end)
  end)
end)
