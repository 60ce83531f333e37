-- upstream_stream_spec.lua: core.http_stream, rich mode's streaming upstream
-- call (spec/rich-mode.md 11.3-11.5, 13.1), against real loopback servers:
-- the scriptable fake upstream (spec/fixtures/fake_upstream.mjs, plain and
-- TLS) and the Anthropic-shaped SSE upstream
-- (spec/fixtures/anthropic_sse_upstream.mjs, from the public Messages API
-- reference). What goes out, the order of callbacks, status passthrough,
-- redirects never followed, the encoding and size refusals, pause/resume
-- and cancel.
local core = require "sandbox.core"
local async = require "sandbox.async"
local fake = require "fake_upstream"
local http_response = require "http_response"
local lfs = require "lfs"

local MIB = 1048576

-- Inside a task: one streamed call; returns the event list and the result.
-- o.on_chunk_hook(call, chunk, events) may pause/cancel.
local function stream(o)
  local events, call = {}, nil
  local res = async.await(function(resume)
    local opts = {}
    for k, v in pairs(o) do if k ~= "on_chunk_hook" then opts[k] = v end end
    opts.on_head = function(status, headers) events[#events + 1] = { "head", status, headers } end
    opts.on_chunk = function(chunk)
      events[#events + 1] = { "chunk", chunk }
      if o.on_chunk_hook then o.on_chunk_hook(call, chunk, events, resume) end
    end
    opts.on_done = function(r) events[#events + 1] = { "done", r }; resume(r) end
    local err
    call, err = core.http_stream(opts)
    if not call then resume({ ok = false, error = "setup: " .. tostring(err) }) end
  end)
  return events, res, call
end

local function body_of(events)
  local out = {}
  for _, e in ipairs(events) do if e[1] == "chunk" then out[#out + 1] = e[2] end end
  return table.concat(out)
end

local function kinds(events)
  local out = {}
  for _, e in ipairs(events) do
    if out[#out] ~= e[1] then out[#out + 1] = e[1] end
  end
  return table.concat(out, ",")
end

describe("core.http_stream (rich-mode.md 11.5)", function()
  local up

  setup(function() up = fake.start() end)
  teardown(function() up:stop() end)

  local function base(path, extra)
    local o = { url = up:url(path), allow_http = true, timeout_ms = 5000 }
    for k, v in pairs(extra or {}) do o[k] = v end
    return o
  end

  it("sends the method, the caller's headers and the body, then delivers head, chunks, done in order", function()
    async.run(function()
      up:reset()
      up:script({ { status = 200, headers = { ["Content-Type"] = "text/event-stream",
        ["X-Multi"] = { "a", "b" }, ["Request-Id"] = "req_1" },
        chunks = { "event: one\n\n", "event: two\n\n", "event: three\n\n" }, chunk_delay_ms = 30 } })
      local body = '{"model":"m","stream":true}'
      local events, res = stream(base("/v1/messages?beta=true", {
        headers = { "Content-Type: application/json", "Authorization: Bearer host-secret",
          "Accept-Encoding: identity" },
        body = body }))
      assert.are.same({ ok = true, status = 200, bytes = 38 }, res)
      assert.are.equal("head,chunk,done", kinds(events))
      assert.are.equal(200, events[1][2])
      assert.are.equal("text/event-stream", events[1][3]["content-type"])
      assert.are.equal("a, b", events[1][3]["x-multi"])
      assert.are.equal("req_1", events[1][3]["request-id"])
      assert.are.equal("event: one\n\nevent: two\n\nevent: three\n\n", body_of(events))
      assert.is_true(#events >= 4, "chunks arrive as they are written")
      local log = up:log()
      assert.are.equal(1, #log)
      assert.are.equal("POST", log[1].method)
      assert.are.equal("/v1/messages?beta=true", log[1].url)
      assert.are.equal(body, log[1].body)
      local names = {}
      for _, h in ipairs(log[1].headers) do names[#names + 1] = h[1] end
      table.sort(names)
      assert.are.same({ "accept-encoding", "authorization", "content-length", "content-type", "host" }, names)
    end)
  end)

  it("delivers every status with its body, 4xx and 5xx included (11.5)", function()
    async.run(function()
      for _, status in ipairs({ 400, 413, 429, 500, 529 }) do
        up:reset()
        up:script({ { status = status, headers = { ["Retry-After"] = "3" }, body = "overloaded " .. status } })
        local events, res = stream(base("/v1/messages"))
        assert.are.same({ ok = true, status = status, bytes = #("overloaded " .. status) }, res)
        assert.are.equal(status, events[1][2])
        assert.are.equal("3", events[1][3]["retry-after"])
        assert.are.equal("overloaded " .. status, body_of(events))
      end
    end)
  end)

  it("never follows a redirect: a 3xx is delivered as it is", function()
    async.run(function()
      up:reset()
      up:script({ { status = 302, headers = { Location = "/elsewhere" }, body = "moved" } })
      local events, res = stream(base("/v1/messages"))
      assert.is_true(res.ok)
      assert.are.equal(302, events[1][2])
      assert.are.equal("/elsewhere", events[1][3].location)
      assert.are.equal(1, #up:log())
    end)
  end)

  it("skips 1xx interim responses and sends a GET without a body", function()
    async.run(function()
      up:reset()
      up:script({ { status = 200, early_hints = { link = "</a>; rel=preload" }, body = "fine" } })
      local events, res = stream(base("/containers/x/json", { method = "GET" }))
      assert.is_true(res.ok)
      assert.are.equal(200, events[1][2])
      assert.is_nil(events[1][3].link)
      assert.are.equal("GET", up:log()[1].method)
      assert.are.equal(0, up:log()[1].body_length)
    end)
  end)

  it("refuses a compressed body before any byte reaches Lua", function()
    async.run(function()
      up:reset()
      up:script({ { status = 200, headers = { ["Content-Encoding"] = "gzip" }, body = "zzz" } })
      local events, res = stream(base("/v1/messages"))
      assert.are.same({ ok = false, error = "encoding", status = 200 }, res)
      assert.are.equal("done", kinds(events))
    end)
  end)

  it("stops a body over max_bytes with too large (the 50 MiB cap)", function()
    async.run(function()
      up:reset()
      up:script({ { status = 200, body = ("x"):rep(1024), ["repeat"] = 64 } })
      local events, res = stream(base("/v1/messages", { max_bytes = 32 * 1024 }))
      assert.is_false(res.ok)
      assert.are.equal("too large", res.error)
      assert.are.equal(200, res.status)
      assert.is_true(#body_of(events) <= 32 * 1024)
      assert.are.equal(50 * MIB, core.limits.STREAM_MAX_RESPONSE_BYTES)
    end)
  end)

  it("ends with too large when max_bytes is crossed by the bytes curl held while paused", function()
    -- curl writes what it held inside curl_easy_pause(CONT); a write that
    -- refuses them fails the transfer only there: the multi never reports it
    -- and, the whole body read, no socket event is left to wake it
    async.run(function()
      up:reset()
      up:script({ { status = 200, body = ("x"):rep(1024), ["repeat"] = 256 } })
      local paused_once = false
      local res = async.await(function(resume)
        local done = false
        local call
        local guard = core.timer(15000, function()
          if not done then done = true call:cancel() resume({ ok = false, error = "no on_done within 15 s" }) end
        end)
        call = assert(core.http_stream(base("/v1/messages", { max_bytes = 70000, timeout_ms = 120000,
          on_head = function() end,
          on_chunk = function()
            if paused_once then return end
            paused_once = true
            call:pause()
            core.timer(200, function() call:resume() end)   -- the rest is read and held by then
          end,
          on_done = function(r)
            if done then return end
            done = true
            guard:stop()
            resume(r)
          end })))
      end)
      assert.is_true(paused_once)
      assert.are.equal("too large", res.error)
    end)
  end)

  it("delivers nothing while paused, then everything after resume", function()
    local size = 4 * MIB
    async.run(function()
      up:reset()
      up:script({ { status = 200, body = ("0123456789abcdef"):rep(4096), ["repeat"] = 64 } })
      local during
      local events, res = stream(base("/v1/messages", { on_chunk_hook = function(call, _, evs)
        if during then return end
        during = #evs
        call:pause()
        assert.is_true(call:paused())
        core.timer(300, function()
          during = #evs - during
          call:resume()
        end)
      end }))
      assert.are.equal(0, during)
      assert.are.same({ ok = true, status = 200, bytes = size }, res)
      local got = body_of(events)
      assert.are.equal(size, #got)
      assert.are.equal(("0123456789abcdef"):rep(4096 * 64), got)
      for _, e in ipairs(events) do
        if e[1] == "chunk" then assert.is_true(#e[2] <= 65536) end
      end
    end)
  end)

  it("reports a failure at once even while paused", function()
    async.run(function()
      up:reset()
      up:script({ { status = 200, chunks = { "first", "second" }, chunk_delay_ms = 2000 } })
      local events, res = stream(base("/v1/messages", { timeout_ms = 600,
        on_chunk_hook = function(call) call:pause() end }))
      assert.are.equal("timeout", res.error)
      assert.are.equal(200, res.status)
      assert.are.equal("first", body_of(events))
    end)
  end)

  it("runs no callback after cancel, even from inside on_chunk, and the upstream sees the abort", function()
    async.run(function()
      up:reset()
      up:script({ { status = 200, chunks = { "a", "b", "c", "d" }, chunk_delay_ms = 50 } })
      local after = {}
      local events = {}
      local call
      call = assert(core.http_stream(base("/v1/messages", {
        on_head = function() events[#events + 1] = "head" end,
        on_chunk = function(c)
          events[#events + 1] = c
          call:cancel()
          call:cancel()
        end,
        on_done = function() after[#after + 1] = "done" end,
      })))
      async.sleep(500)
      assert.are.same({ "head", "a" }, events)
      assert.are.same({}, after)
      local log = up:log()
      assert.is_true(log[1].aborted)
    end)
  end)

  it("reports a timeout, a refused connection with its errno, and https-only without contacting", function()
    async.run(function()
      up:reset()
      up:script({ { status = 200, delay_ms = 3000, body = "late" } })
      local _, res = stream(base("/v1/messages", { timeout_ms = 200 }))
      assert.is_false(res.ok)
      assert.are.equal("timeout", res.error)
      local _, refused = stream({ url = ("http://127.0.0.1:%d/"):format(fake.closed_port()),
        allow_http = true, timeout_ms = 2000 })
      assert.are.equal("network", refused.error)
      assert.are.equal("ECONNREFUSED", refused.code)
      assert.is_string(refused.message)
      up:reset()
      local _, plain = stream({ url = up:url("/v1/messages"), timeout_ms = 2000 })
      assert.are.equal("network", plain.error)
      assert.are.equal(0, #up:log())
    end)
  end)

  it("raises on malformed options", function()
    local ok = function() end
    local o = function(extra)
      local t = { url = "https://api.anthropic.com/v1/messages", timeout_ms = 1000,
        on_head = ok, on_chunk = ok, on_done = ok }
      for k, v in pairs(extra) do t[k] = v end
      return t
    end
    assert.has_error(function() core.http_stream(o({ timeout_ms = 0 })) end,
      "http_stream: opts.timeout_ms must be an integer in 1..600000")
    assert.has_error(function() core.http_stream(o({ headers = { "Host: x" } })) end,
      "http_stream: the host header is set by the client")
    assert.has_error(function() core.http_stream(o({ headers = { "X: a\r\nY: b" } })) end,
      "http_stream: header value holds a control character")
    assert.has_error(function() core.http_stream(o({ method = "PO ST" })) end,
      "http_stream: opts.method must be a token")
    assert.has_error(function() core.http_stream(o({ on_chunk = false })) end,
      "http_stream: opts.on_chunk must be a function")
    assert.has_error(function() core.http_stream(o({ max_bytes = 50 * MIB + 1 })) end)
  end)

  describe("through the stream listener (rich-mode.md 8, Streaming)", function()
    local dir, path, listener
    before_each(function()
      dir = assert(io.popen("mktemp -d /tmp/sbx-stream-spec.XXXXXX")):read("l")
      path = dir .. "/broker.sock"
    end)
    after_each(function()
      if listener then listener:stop(true) end
      for _ = 1, 5 do core.run("nowait") end
      os.remove(path)
      lfs.rmdir(dir)
    end)

    -- The broker's streaming glue in miniature: the upstream's chunks go to
    -- the worker; 16 KiB queued pauses the upstream, a drain resumes it, a
    -- worker that leaves cancels it.
    local function proxy(state)
      return function(req)
        req:read_body(function()
          local call
          call = assert(core.http_stream(base("/v1/messages", {
            on_head = function(status) req:start(status, { ["content-type"] = "text/event-stream" }) end,
            on_chunk = function(chunk)
              local _, pressured = req:write(chunk)
              if pressured then state.pauses = state.pauses + 1; call:pause() end
            end,
            on_done = function(res) state.done = res; req:finish() end,
          })))
          req:on_drain(function() call:resume() end)
          req:on_close(function(reason)
            state.closed = reason
            if reason ~= "finished" then call:cancel() end
          end)
        end)
      end
    end

    local BODY = ("data: " .. ("z"):rep(1017) .. "\n\n"):rep(1024)     -- 1 MiB of events

    it("pauses the upstream while the worker does not read and delivers all of it after", function()
      local state = { pauses = 0 }
      async.run(function()
        up:reset()
        up:script({ { status = 200, body = BODY } })
        listener = assert(core.stream_listen { path = path, on_request = proxy(state) })
        local reader = http_response.slow_reader(path, "POST /anthropic/v1/messages HTTP/1.1\r\n"
          .. "Content-Length: 2\r\n\r\n{}")
        local t0 = core.now()
        while state.pauses == 0 and core.now() - t0 < 5000 do async.sleep(10) end
        assert.is_true(state.pauses > 0)
        assert.is_nil(state.done)
        assert.is_true(reader:read())
        local res = reader:wait()
        assert.are.equal(200, res.status)
        assert.is_true(res.complete)
        assert.are.equal(BODY, res.body)
      end)
      assert.are.same({ ok = true, status = 200, bytes = #BODY }, state.done)
      assert.are.equal("finished", state.closed)
    end)

    it("cancels the upstream when the worker goes away mid-stream", function()
      local state = { pauses = 0 }
      async.run(function()
        up:reset()
        up:script({ { status = 200, chunks = { "data: 1\n\n", "data: 2\n\n", "data: 3\n\n" },
          chunk_delay_ms = 200 } })
        listener = assert(core.stream_listen { path = path, on_request = proxy(state) })
        local s
        s = core.unix_stream(path, function(ev) if ev == "data" then s:close() end end)
        s:write("POST /anthropic/v1/messages HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
        local t0 = core.now()
        while state.closed == nil and core.now() - t0 < 5000 do async.sleep(10) end
        async.sleep(800)
        assert.is_true(up:log()[1].aborted)
      end)
      assert.are.equal("gone", state.closed)
      assert.is_nil(state.done)
    end)
  end)

  describe("over TLS through the trusted seams", function()
    local dir, tls
    setup(function()
      dir = assert(io.popen("mktemp -d /tmp/sbx-stream-spec.XXXXXX")):read("l")
      tls = fake.start({ tls = fake.make_ca(dir) })
    end)
    teardown(function()
      tls:stop()
      os.execute("rm -rf '" .. dir .. "'")
    end)

    it("streams from an https upstream, verified against the given CA", function()
      async.run(function()
        tls:reset()
        tls:script({ { status = 200, chunks = { "data: 1\n\n", "data: 2\n\n" } } })
        local o = tls:seams()
        o.url, o.timeout_ms = tls:url("/v1/messages"), 5000
        local events, res = stream(o)
        assert.is_true(res.ok, tostring(res.error) .. " " .. tostring(res.message))
        assert.are.equal("data: 1\n\ndata: 2\n\n", body_of(events))
        o.cainfo = nil
        local _, bad = stream(o)
        assert.are.equal("network", bad.error)
      end)
    end)
  end)

  describe("against the Anthropic-shaped SSE upstream", function()
    local anth, pipe
    setup(function()
      local script = os.tmpname()
      local f = assert(io.open(script, "w"))
      -- message_start, ping, a text block in deltas, an error event mid-stream
      f:write([[[{"raw":"x"},{"events":[
        {"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"claude","content":[],"usage":{"input_tokens":1,"output_tokens":1}}},
        {"type":"ping"},
        {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}},
        {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}},
        {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}],
        "chunkBytes":7}]
      ]])
      f:close()
      pipe = assert(io.popen(("exec env -u LD_PRELOAD bun spec/fixtures/anthropic_sse_upstream.mjs --script %s --parent-pid %d")
        :format(script, core.getpid())))
      local line = pipe:read("l")
      anth = { port = tonumber(line:match('"port":(%d+)')), pid = tonumber(line:match('"pid":(%d+)')) }
      os.remove(script)
    end)
    teardown(function()
      os.execute(("kill %d 2>/dev/null"):format(anth.pid))
      pipe:close()
    end)

    it("streams SSE in 7-byte writes through the reflection stream and the error watch", function()
      async.run(function()
        local url = ("http://127.0.0.1:%d/v1/messages?beta=true"):format(anth.port)
        local _, first = stream({ url = url, allow_http = true, timeout_ms = 5000, body = '{"stream":true}' })
        assert.is_true(first.ok)                                 -- the {"raw":"x"} reply
        local filter = core.reflect_stream("host-secret-token")
        local watch = core.sse_watch()
        local out, reported = {}, {}
        local events, res = stream({ url = url, allow_http = true, timeout_ms = 5000,
          headers = { "Content-Type: application/json", "Accept: application/json, text/event-stream" },
          body = '{"stream":true}',
          on_chunk_hook = function(_, chunk)
            out[#out + 1] = assert(filter:push(chunk))
            reported[#reported + 1] = watch:push(chunk)
          end })
        out[#out + 1] = filter:finish()
        assert.is_true(res.ok)
        assert.are.equal("text/event-stream; charset=utf-8", events[1][3]["content-type"])
        local body = body_of(events)
        assert.are.equal(body, table.concat(out))
        assert.matches("^event: message_start\ndata: ", body)
        assert.are.equal(1, #reported)
        assert.matches('^{"type":"error","error":{"type":"overloaded_error"', reported[1])
      end)
    end)
  end)
end)
