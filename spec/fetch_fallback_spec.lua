-- fetch_fallback_spec.lua: safe fetch's connection fallback and deadlines
-- (shared/spec/fetch-and-delegation.md 1.10, with 1.8 and 1.15), through the
-- real pinned transport.
--
-- Loopback refuses at once, so the slow and broken peers come from
-- spec/fixtures/stall_server.mjs (spec/support/stall_server.lua): a port whose
-- full accept queue makes connect() hang, a port that accepts and never
-- speaks (a TLS ClientHello is never answered), resets before and after the
-- response began, and healthy http/https ports. Every port counts the
-- connections it accepted. As in fetch_spec.lua, the trusted `resolve` seam
-- answers public addresses as data only, and the `transport` seam sends each
-- vetted address to one fixture port through fetch.pinned_transport, logging
-- when each attempt started and ended and how it failed. Network traffic goes
-- only to 127.0.0.1.
--
-- ECONNREFUSED fallback on its own is fetch_spec.lua's item 12; here it only
-- opens a chain. Timing bounds are loose on purpose (the machine is shared);
-- set SBX_SPEC_TIMES=1 to print the measured durations.
local core = require "sandbox.core"
local async = require "sandbox.async"
local signal = require "sandbox.signal"
local fetch = require "sandbox.fetch"
local fake = require "fake_upstream"
local stall = require "stall_server"

local A, B, C = "93.184.216.34", "93.184.216.35", "93.184.216.36"
local CONNECT_MIN_MS = 2500     -- the 3,000 ms connect deadline, measured loosely
local CONNECT_MAX_MS = 6000

local srv, dir

local function note(what, ms)
  if os.getenv("SBX_SPEC_TIMES") then io.stderr:write(string.format("  [%s: %d ms]\n", what, ms)) end
end

local closed_port = fake.closed_port

-- Runs fn inside a task; returns ok, result-or-error.
local function run(fn)
  return async.run(function() return pcall(fn) end)
end

local function stats() local _, s = run(function() return srv:stats() end) return s end

-- Trusted seams. o.answers: the addresses the resolver returns, in order;
-- o.ports: address -> fixture port; o.limits: pinned_transport's limits;
-- o.stats: read the fixture's counts as each attempt ends (not with an abort,
-- whose seam may still be running when the call has returned).
local function seams(o)
  local log = { lookups = 0, calls = {} }
  local list = {}
  for i, a in ipairs(o.answers) do list[i] = { address = a, family = 4 } end
  local opts = {
    resolve = function()
      log.lookups = log.lookups + 1
      return list
    end,
    localAddresses = function() return {} end,
    transport = function(u, address, sig, maxBytes, headers)
      local call = { address = address.address, started = core.now(), signal = sig }
      log.calls[#log.calls + 1] = call
      local ok, res = pcall(fetch.pinned_transport, u,
        { address = "127.0.0.1", family = 4, port = assert(o.ports[address.address]) },
        sig, maxBytes, headers, o.limits)
      call.ended = core.now()
      call.err = not ok and res or nil
      if o.stats then call.stats = srv:stats() end
      if not ok then error(res, 0) end
      return res
    end,
  }
  for k, v in pairs(o.opts or {}) do opts[k] = v end
  return opts, log
end

local function addresses(log)
  local out = {}
  for i, c in ipairs(log.calls) do out[i] = c.address end
  return out
end

local function took(call) return call.ended - call.started end

local function assert_connect_deadline(call)
  local e = call.err
  assert.are.equal("table", type(e))
  assert.are.equal("TransportError", e.name)
  assert.are.equal("Connection deadline exceeded", e.message)
  assert.are.equal("ETIMEDOUT", e.code)
  assert.is_true(took(call) >= CONNECT_MIN_MS, "attempt ended after " .. took(call) .. " ms")
  assert.is_true(took(call) < CONNECT_MAX_MS, "attempt ended after " .. took(call) .. " ms")
end

-- Each attempt starts only after the one before it has ended.
local function assert_one_at_a_time(log)
  for i = 2, #log.calls do
    assert.is_true(log.calls[i].started >= log.calls[i - 1].ended,
      ("attempt %d started before attempt %d ended"):format(i, i - 1))
  end
end

-- A cancelled or expired connect leaves no socket behind.
local function assert_no_pending_connect()
  run(function() async.sleep(50) end)
  assert.are.equal(0, stall.syn_sent(srv.stall_port))
end

local function http_url(path) return ("http://never-resolve.invalid:%d%s"):format(srv.http_port, path) end
local function https_url(host) return ("https://%s:%d/page"):format(host, srv.tls_port) end

describe("safe fetch connection fallback and deadlines (1.10)", function()
  local tls
  setup(function()
    dir = assert(core.fs_mkdtemp("/tmp/sbx-fetch-fallback-XXXXXX"))
    tls = fake.make_ca(dir)               -- CN/SAN models.example, also the CA
    srv = stall.start { tls = tls }
  end)
  teardown(function()
    if srv then srv:stop() end
    if dir then core.fs_rmtree(dir) end
  end)
  before_each(function()
    local ok, err = run(function() return srv:reset() end)
    assert(ok, tostring(err))
  end)

  it("the fixture's stalled port really hangs: its accept queue is full and overflow does not reset", function()
    local f = assert(io.open("/proc/sys/net/ipv4/tcp_abort_on_overflow"))
    assert.are.equal("0", f:read("l"))
    f:close()
    assert.is_true(srv.fillers >= 1)
  end)

  describe("the 3 s connect deadline on TCP", function()
    it("a connect that never completes fails with ETIMEDOUT after about 3 s; the next vetted address is used", function()
      local opts, log = seams { answers = { A, B }, ports = { [A] = srv.stall_port, [B] = srv.http_port },
        stats = true, opts = { timeoutMs = 30000 } }
      local t0 = core.now()
      local ok, res = run(function() return fetch.safe_fetch(http_url("/page"), opts) end)
      local total = core.now() - t0
      note("stalled TCP attempt", took(log.calls[1]))
      note("TCP fallback call", total)
      assert.is_true(ok, tostring(res))
      assert.are.equal(200, res.status)
      assert.are.equal("ok", res.data)
      assert.are.equal(1, log.lookups)
      assert.are.same({ A, B }, addresses(log))
      assert_connect_deadline(log.calls[1])
      assert.is_true(total < 15000, "call took " .. total .. " ms")
      -- never raced: the healthy server had seen nothing when the first attempt ended
      assert.are.equal(0, log.calls[1].stats.http)
      assert_one_at_a_time(log)
      assert.are.equal(1, stats().http)
      assert_no_pending_connect()
    end)

    it("with only stalled addresses, each gets its own deadline and the call raises 'No vetted address could be reached'", function()
      local opts, log = seams { answers = { A, B }, ports = { [A] = srv.stall_port, [B] = srv.stall_port },
        opts = { timeoutMs = 30000 } }
      local t0 = core.now()
      local ok, err = run(function() return fetch.safe_fetch(http_url("/page"), opts) end)
      local total = core.now() - t0
      note("two stalled attempts", total)
      assert.is_false(ok)
      assert.are.equal("UnsafeUrlError", err.name)
      assert.are.equal("No vetted address could be reached", tostring(err))
      assert.is_true(fetch.is_unsafe_url_error(err))
      assert.are.equal(1, log.lookups)
      assert.are.same({ A, B }, addresses(log))
      assert_connect_deadline(log.calls[1])
      assert_connect_deadline(log.calls[2])
      assert_one_at_a_time(log)
      assert.is_true(total < 15000, "call took " .. total .. " ms")
      assert_no_pending_connect()
    end)
  end)

  describe("the connect deadline covers the TLS handshake", function()
    it("a server that accepts TCP but never answers the ClientHello times out after about 3 s; the next address is used", function()
      local opts, log = seams { answers = { A, B }, ports = { [A] = srv.silent_port, [B] = srv.tls_port },
        limits = { cainfo = tls.ca }, stats = true, opts = { timeoutMs = 30000 } }
      local t0 = core.now()
      local ok, res = run(function() return fetch.safe_fetch(https_url("models.example"), opts) end)
      local total = core.now() - t0
      note("stalled TLS attempt", took(log.calls[1]))
      assert.is_true(ok, tostring(res))
      assert.are.equal("ok", res.data)
      assert.are.same({ A, B }, addresses(log))
      assert_connect_deadline(log.calls[1])
      -- TCP was accepted: it was the handshake that stalled
      assert.are.equal(1, log.calls[1].stats.silent)
      assert.are.equal(0, log.calls[1].stats.tls)
      assert.are.equal(1, stats().tls)
      assert.is_true(total < 15000, "call took " .. total .. " ms")
    end)
  end)

  describe("the connect deadline is clipped to the time left", function()
    it("timeoutMs = 1000 against a stalled address ends with 'Fetch deadline exceeded' after about 1 s; no later address is tried", function()
      local opts, log = seams { answers = { A, B }, ports = { [A] = srv.stall_port, [B] = srv.http_port },
        opts = { timeoutMs = 1000 } }
      local t0 = core.now()
      local ok, err = run(function() return fetch.safe_fetch(http_url("/page"), opts) end)
      local total = core.now() - t0
      note("timeoutMs = 1000 call", total)
      assert.is_false(ok)
      assert.are.equal("TimeoutError", err.name)
      assert.are.equal("Fetch deadline exceeded", tostring(err))
      assert.is_true(total >= 900 and total < 2500, "call took " .. total .. " ms")
      assert.are.same({ A }, addresses(log))
      -- the seam's attempt was cancelled through its signal, not left to run
      assert_no_pending_connect()
      assert.is_true(log.calls[1].signal.aborted)
      assert.is_not_nil(log.calls[1].ended)
      assert.is_true(took(log.calls[1]) < 2500)
      assert.are.equal(0, stats().http)
    end)

    it("pinned_transport clips its connect deadline to the deadline it is given", function()
      local t0 = core.now()
      local ok, err = run(function()
        return fetch.pinned_transport(http_url("/page"), { address = "127.0.0.1", family = 4, port = srv.stall_port },
          nil, nil, {}, { deadline = core.now() + 1000 })
      end)
      local total = core.now() - t0
      note("pinned_transport with 1000 ms left", total)
      assert.is_false(ok)
      -- The clipped connect deadline and the deadline itself expire together:
      -- mostly the deadline's timer fires first, now and then curl's (about
      -- 1 run in 20 here). Either way the attempt ends at ~1 s, not 3 s.
      if err.name == "TransportError" then
        assert.are.equal("Connection deadline exceeded", err.message)
        assert.are.equal("ETIMEDOUT", err.code)
      else
        assert.are.equal("TimeoutError", err.name)
        assert.are.equal("Fetch deadline exceeded", tostring(err))
      end
      assert.is_true(total >= 900 and total < 2500, "attempt took " .. total .. " ms")
      assert_no_pending_connect()
    end)
  end)

  describe("fallback only for the listed codes before any response byte", function()
    it("refused connects fall back, one address at a time in resolver order, after one lookup", function()
      local opts, log = seams { answers = { A, B, C },
        ports = { [A] = closed_port(), [B] = closed_port(), [C] = srv.http_port }, stats = true }
      local ok, res = run(function() return fetch.safe_fetch(http_url("/page"), opts) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("ok", res.data)
      assert.are.equal(1, log.lookups)
      assert.are.same({ A, B, C }, addresses(log))
      assert.are.equal("ECONNREFUSED", log.calls[1].err.code)
      assert.are.equal("ECONNREFUSED", log.calls[2].err.code)
      assert_one_at_a_time(log)
      assert.are.equal(0, log.calls[2].stats.http)
      assert.are.equal(1, stats().http)
    end)

    -- The reset arrives as EPOLLERR; core/curl_loop.c hands it to curl as
    -- readable+writable so curl reads the real errno (ECONNRESET).
    it("a reset before any response byte (ECONNRESET) falls back to the next address", function()
      local opts, log = seams { answers = { A, B }, ports = { [A] = srv.early_port, [B] = srv.http_port },
        stats = true }
      local ok, res = run(function() return fetch.safe_fetch(http_url("/page"), opts) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("ok", res.data)
      assert.are.same({ A, B }, addresses(log))
      assert.are.equal("TransportError", log.calls[1].err.name)
      assert.are.equal("ECONNRESET", log.calls[1].err.code)
      assert.are.same({ 1, 0 }, { log.calls[1].stats.early, log.calls[1].stats.http })
      assert.are.equal(1, stats().http)
    end)

    it("a reset after the response began ends the call; the next address is never contacted", function()
      local opts, log = seams { answers = { A, B }, ports = { [A] = srv.reset_port, [B] = srv.http_port } }
      local ok, err = run(function() return fetch.safe_fetch(http_url("/page"), opts) end)
      assert.is_false(ok)
      assert.are.equal("TransportError", err.name)
      assert.are_not.equal("No vetted address could be reached", tostring(err))
      assert.are.same({ A }, addresses(log))
      local n = stats()
      assert.are.equal(1, n.reset)
      assert.are.equal(0, n.http)
    end)

    it("a certificate for another name ends the call; the next address is never contacted", function()
      local opts, log = seams { answers = { A, B }, ports = { [A] = srv.tls_port, [B] = srv.tls_port },
        limits = { cainfo = tls.ca } }
      local ok, err = run(function() return fetch.safe_fetch(https_url("other.example"), opts) end)
      assert.is_false(ok)
      assert.are.equal("TransportError", err.name)
      assert.are_not.equal("No vetted address could be reached", tostring(err))
      assert.are.same({ A }, addresses(log))
      assert.are.equal(1, stats().tls)
    end)
  end)

  describe("one lookup per hop", function()
    it("each hop asks the resolver once and falls back within that hop's answer", function()
      local opts, log = seams { answers = { A, B }, ports = { [A] = closed_port(), [B] = srv.http_port } }
      local ok, res = run(function() return fetch.safe_fetch(http_url("/redirect"), opts) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("ok", res.data)
      assert.are.equal(http_url("/done"), res.url)
      assert.are.equal(2, log.lookups)
      assert.are.same({ A, B, A, B }, addresses(log))
      assert_one_at_a_time(log)
      assert.are.equal(2, stats().http)
    end)
  end)

  describe("the caller's signal", function()
    it("an abort during a stalled connect ends the call at once with exactly the signal's reason", function()
      local sig = signal.new()
      local opts, log = seams { answers = { A, B }, ports = { [A] = srv.stall_port, [B] = srv.http_port },
        opts = { signal = sig, timeoutMs = 30000 } }
      local t0, t_abort = core.now(), nil
      local ok, err = run(function()
        core.timer(300, function() t_abort = core.now(); sig:abort("turn ended") end)
        return fetch.safe_fetch(http_url("/page"), opts)
      end)
      local t_end = core.now()
      note("abort -> call ended", t_end - t_abort)
      assert.is_false(ok)
      assert.is_true(rawequal(signal.AbortError, err), tostring(err))
      assert.is_true(t_end - t_abort < 500, "ended " .. (t_end - t_abort) .. " ms after the abort")
      assert.is_true(t_end - t0 < 1500)
      assert.are.same({ A }, addresses(log))
      assert_no_pending_connect()
      assert.is_true(log.calls[1].signal.aborted)
      assert.is_true(rawequal(signal.AbortError, log.calls[1].err))
      assert.are.equal(0, stats().http)
    end)

    it("pinned_transport itself stops a stalled connect when its signal aborts", function()
      local sig = signal.new()
      local t_abort
      local ok, err = run(function()
        core.timer(300, function() t_abort = core.now(); sig:abort("turn ended") end)
        return fetch.pinned_transport(http_url("/page"), { address = "127.0.0.1", family = 4, port = srv.stall_port },
          sig, nil, {})
      end)
      local t_end = core.now()
      assert.is_false(ok)
      assert.is_true(rawequal(signal.AbortError, err), tostring(err))
      assert.is_true(t_end - t_abort < 500)
      assert_no_pending_connect()
    end)
  end)
end)
