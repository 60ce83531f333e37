-- fetch_spec.lua: safe fetch (shared/spec/fetch-and-delegation.md section 1;
-- the numbers in the describe names are the section 5 items).
--
-- Network traffic goes only to loopback. Names never reach a real resolver:
-- every spec that uses a hostname passes the trusted `resolve` seam, which
-- answers public addresses as data only (93.184.216.34, 2606:2800::1), and a
-- `transport` seam that sends the vetted address to the loopback fixture
-- (spec/fixtures/fetch_server.mjs) through the real pinned transport.
local core = require "sandbox.core"
local async = require "sandbox.async"
local signal = require "sandbox.signal"
local fetch = require "sandbox.fetch"

local PUBLIC4, PUBLIC4B, PUBLIC6 = "93.184.216.34", "93.184.216.35", "2606:2800::1"

local server = {}

local function start_server()
  server.dir = assert(io.popen("mktemp -d /tmp/sbx-fetch-spec.XXXXXX")):read("l")
  server.tls = require("fake_upstream").make_ca(server.dir)     -- CN/SAN models.example
  local cmd = string.format("exec env -u LD_PRELOAD node spec/fixtures/fetch_server.mjs --parent %d --tls '%s' '%s'",
    core.getpid(), server.tls.cert, server.tls.key)
  server.pipe = assert(io.popen(cmd, "r"))
  local line = assert(server.pipe:read("l"))
  server.port = tonumber(line:match('"port":(%d+)'))
  server.pid = tonumber(line:match('"pid":(%d+)'))
  server.tls_port = tonumber(line:match('"tls_port":(%d+)'))
  assert(server.port and server.pid and server.tls_port)
end

local function url(path, host)
  return string.format("http://%s:%d%s", host or "never-resolve.invalid", server.port, path)
end

local closed_port = require("fake_upstream").closed_port

-- Trusted seams: resolve answers `answers` (or the next list of `answers`
-- per call when it is a list of lists) and counts calls; the transport runs
-- the real pinned transport against the loopback server and records each
-- call's address and headers.
local function seams(o)
  o = o or {}
  local log = { lookups = 0, hosts = {}, calls = {} }
  local answers = o.answers or { { address = PUBLIC4, family = 4 } }
  local opts = {
    resolve = function(host)
      log.lookups = log.lookups + 1
      log.hosts[#log.hosts + 1] = host
      if answers[1] and answers[1][1] then return answers[math.min(log.lookups, #answers)] end
      return answers
    end,
    localAddresses = function() return o.locals or {} end,
    transport = function(u, address, sig, maxBytes, headers)
      log.calls[#log.calls + 1] = { url = u, address = address.address, headers = headers }
      local port = (o.ports and o.ports[address.address]) or (o.tls and server.tls_port) or server.port
      return fetch.pinned_transport(u, { address = "127.0.0.1", family = 4, port = port },
        sig, maxBytes, headers, o.limits)
    end,
  }
  for k, v in pairs(o.opts or {}) do opts[k] = v end
  return opts, log
end

-- Runs fn inside a task; returns ok, result-or-error.
local function run(fn)
  return async.run(function() return pcall(fn) end)
end

local function refused(fn, message, name)
  local ok, err = run(fn)
  assert.is_false(ok)
  assert.are.equal(message, tostring(err))
  if name then assert.are.equal(name, err.name) end
  return err
end

local function never_answers() async.await(function() end) end

describe("safe fetch", function()
  setup(start_server)
  teardown(function()
    if server.pipe then
      os.execute("kill " .. server.pid .. " >/dev/null 2>&1")
      server.pipe:close()
      os.execute("rm -rf '" .. server.dir .. "'")
    end
  end)

  describe("address policy (items 1-4)", function()
    it("1: refuses private, local, metadata and transition addresses", function()
      for _, a in ipairs {
        "127.0.0.1", "10.2.3.4", "172.31.1.1", "169.254.169.254", "192.168.1.1", "100.64.0.1",
        "0.0.0.0", "224.0.0.1", "198.18.0.1", "192.0.2.1", "192.0.0.9", "::1", "::", "fc00::1",
        "fe80::1", "::ffff:127.0.0.1", "0:0:0:0:0:ffff:7f00:1", "2001:db8::1", "2002:7f00:1::",
        "2001::1", "2001::abcd:1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:10::1",
        "2001:2f::1", "64:ff9b::7f00:1", "::ffff:169.254.169.254" } do
        assert.is_false(fetch.is_public_address(a), a)
      end
    end)

    it("2: accepts public IPv4, IPv6 and IPv4-mapped public addresses", function()
      for _, a in ipairs { "8.8.8.8", "1.1.1.1", "192.0.1.1", "2606:4700:4700::1111",
        "2001:4860:4860::8888", "2001:30::1", "::ffff:8.8.8.8" } do
        assert.is_true(fetch.is_public_address(a), a)
      end
    end)

    it("3: a zone id, a leading-zero quad or non-literal text is not public", function()
      for _, a in ipairs { "2606:4700::1%eth0", "08.8.8.8", "8.8.8.08", "example.com", "",
        "8.8.8", "0x08080808", " 8.8.8.8" } do
        assert.is_false(fetch.is_public_address(a), a)
      end
      assert.is_false(fetch.is_public_address(nil))
    end)

    it("4: refuses one of the host's own addresses even when it is public", function()
      local opts, log = seams { locals = { PUBLIC4 } }
      refused(function() return fetch.safe_fetch(url("/echo"), opts) end,
        "URL resolves to a non-public address", "UnsafeUrlError")
      assert.are.equal(0, #log.calls)
      -- an IPv4-mapped answer is compared by its IPv4
      opts, log = seams { locals = { PUBLIC4 }, answers = { { address = "::ffff:" .. PUBLIC4, family = 6 } } }
      refused(function() return fetch.safe_fetch(url("/echo"), opts) end,
        "URL resolves to a non-public address")
      assert.are.equal(0, #log.calls)
    end)
  end)

  describe("URL admission (items 5-7)", function()
    it("5: refuses other schemes, credentials and encoded loopback without calling the transport", function()
      local cases = {
        { "file:///etc/passwd", "Only credential-free HTTP(S) URLs are allowed" },
        { "gopher://example.test/", "Only credential-free HTTP(S) URLs are allowed" },
        { "http://user:password@example.test", "Only credential-free HTTP(S) URLs are allowed" },
        { "http://2130706433", "URL resolves to a non-public address" },
        { "http://0x7f000001", "URL resolves to a non-public address" },
        { "http://0177.0.0.1", "URL resolves to a non-public address" },
        { "http://[::ffff:7f00:1]", "URL resolves to a non-public address" },
        { "/etc/hosts", "Invalid URL" },
        { "http://exa mple.com/", "Invalid URL" },
      }
      for _, c in ipairs(cases) do
        local opts, log = seams()
        refused(function() return fetch.safe_fetch(c[1], opts) end, c[2], "UnsafeUrlError")
        assert.are.equal(0, #log.calls, c[1])
        assert.are.equal(0, log.lookups, c[1])
      end
    end)

    it("6: refuses an explicit port 0 before any lookup", function()
      local opts, log = seams()
      refused(function() return fetch.safe_fetch("http://example.test:0/", opts) end,
        "Port 0 is not allowed")
      assert.are.equal(0, log.lookups)
    end)

    it("7: refuses bad bounds before any lookup, and bad trusted headers", function()
      local bad = {
        { maxBytes = 0 }, { maxBytes = -1 }, { maxBytes = 1.5 }, { maxBytes = 0 / 0 },
        { maxBytes = math.huge }, { maxBytes = 33554433 }, { maxBytes = "10" },
        { timeoutMs = 120001 }, { timeoutMs = 0 }, { idleTimeoutMs = 0 }, { idleTimeoutMs = true },
        { maxRedirects = 11 }, { maxRedirects = -1 }, { maxRedirects = 2.5 },
        { followRedirects = "no" }, { followRedirects = 0 },
      }
      for _, b in ipairs(bad) do
        local opts, log = seams { opts = b }
        refused(function() return fetch.safe_fetch("file:///not-parsed-yet", opts) end,
          "Invalid fetch bounds", "UnsafeUrlError")
        assert.are.equal(0, log.lookups)
      end
      -- integral floats are accepted
      local opts = seams { opts = { maxBytes = 1000.0, maxRedirects = 0.0 } }
      local ok, res = run(function() return fetch.safe_fetch(url("/short"), opts) end)
      assert.is_true(ok, tostring(res))
      local headers = {
        { ["x-ok"] = "a\r\nInjected: 1" }, { ["x-ok"] = "a\nb" }, { ["x-ok"] = "a\0b" },
        { Host = "evil" }, { ["Proxy-Authorization"] = "x" }, { ["Transfer-Encoding"] = "chunked" },
        { ["bad name"] = "v" }, { ["x-n"] = 5 }, { ["X-A"] = "1", ["x-a"] = "2" },
        { ["x-long"] = string.rep("a", 8193) }, { [string.rep("n", 257)] = "v" },
      }
      local many = {}
      for i = 1, 33 do many["x-h" .. i] = "v" end
      headers[#headers + 1] = many
      for _, h in ipairs(headers) do
        local o, log = seams { opts = { headers = h } }
        refused(function() return fetch.safe_fetch(url("/echo"), o) end, "Invalid fetch headers")
        assert.are.equal(0, log.lookups)
      end
    end)
  end)

  describe("vetting and pinning (items 8-12)", function()
    it("8: one hop does one lookup; the pinned connection ignores what a second lookup would say", function()
      local opts, log = seams { answers = { { { address = PUBLIC4, family = 4 } },
        { { address = "127.0.0.1", family = 4 } } } }
      local ok, res = run(function() return fetch.safe_fetch(url("/echo"), opts) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal(200, res.status)
      assert.are.equal(1, log.lookups)
      assert.are.equal(1, #log.calls)
      assert.are.equal(PUBLIC4, log.calls[1].address)
    end)

    it("9: refuses a mixed public/private answer as a whole", function()
      for _, bad in ipairs { "10.0.0.1", "::1", "169.254.169.254", "fd00:ec2::254" } do
        local opts, log = seams { answers = { { address = PUBLIC4, family = 4 },
          { address = bad, family = bad:find(":") and 6 or 4 } } }
        refused(function() return fetch.safe_fetch(url("/echo"), opts) end,
          "URL resolves to a non-public address")
        assert.are.equal(0, #log.calls)
      end
    end)

    it("9: refuses empty and malformed answers", function()
      for _, answers in ipairs {
        {}, { { address = "93.184.216.034", family = 4 } }, { { address = PUBLIC4, family = 6 } },
        { { address = PUBLIC6, family = 4 } }, { { address = PUBLIC4 } }, { { address = "example.com", family = 4 } },
        { { address = PUBLIC6 .. "%eth0", family = 6 } }, { "93.184.216.34" },
      } do
        local opts, log = seams()
        opts.resolve = function() return answers end
        refused(function() return fetch.safe_fetch(url("/echo"), opts) end,
          "URL resolves to a non-public address")
        assert.are.equal(0, #log.calls)
      end
    end)

    -- The live defaults of the C hop loop (core/fetch_call.c): getaddrinfo on
    -- the libuv thread pool, and the host's own interfaces (getifaddrs) at
    -- every vetting. "localhost" comes from /etc/hosts: no DNS. (A lookup
    -- abandoned while in flight: spec/c/fetch/fetch_test.c, which can cancel
    -- between the loop turns that queue and answer it.)
    it("the system resolver runs on the thread pool and every answer it gives is vetted", function()
      refused(function()
        return fetch.safe_fetch("http://localhost:" .. server.port .. "/echo", { localAddresses = function() return {} end })
      end, "URL resolves to a non-public address", "UnsafeUrlError")
      refused(function() return fetch.assert_public_url("http://localhost/") end,
        "URL resolves to a non-public address", "UnsafeUrlError")
    end)

    it("the host's own interfaces are read at every vetting (getifaddrs): a public literal passes", function()
      local ok, res = run(function() return fetch.assert_public_url("http://93.184.216.34:81/x") end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("http://93.184.216.34:81/x", res)
    end)

    it("a resolver failure raises ResolveError with the resolver's text", function()
      local opts = seams()
      opts.resolve = function() error("Name or service not known", 0) end
      refused(function() return fetch.safe_fetch(url("/echo"), opts) end,
        "Name or service not known", "ResolveError")
    end)

    it("10: falls back to the next vetted address of the same lookup on ENETUNREACH", function()
      local lookups, order = 0, {}
      local ok, res = run(function()
        return fetch.safe_fetch(url("/short"), {
          resolve = function()
            lookups = lookups + 1
            return { { address = PUBLIC4, family = 4 }, { address = PUBLIC6, family = 6 },
              { address = PUBLIC4B, family = 4 } }
          end,
          localAddresses = function() return {} end,
          transport = function(u, address, sig, maxBytes, headers)
            order[#order + 1] = address.address
            if address.address == PUBLIC4 then
              error(fetch.new_error("TransportError", "Network is unreachable", { code = "ENETUNREACH" }), 0)
            end
            return fetch.pinned_transport(u, { address = "127.0.0.1", family = 4, port = server.port },
              sig, maxBytes, headers)
          end,
        })
      end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("ok", res.data)
      assert.are.equal(1, lookups)
      assert.are.same({ PUBLIC4, PUBLIC6 }, order)
    end)

    it("10: a non-fallback error ends the call at once; all fallback failures give 'No vetted address'", function()
      local calls = 0
      local base = {
        resolve = function() return { { address = PUBLIC4, family = 4 }, { address = PUBLIC4B, family = 4 } } end,
        localAddresses = function() return {} end,
      }
      base.transport = function()
        calls = calls + 1
        error(fetch.new_error("TransportError", "certificate problem"), 0)
      end
      refused(function() return fetch.safe_fetch(url("/"), base) end, "certificate problem", "TransportError")
      assert.are.equal(1, calls)
      calls = 0
      base.transport = function()
        calls = calls + 1
        error(fetch.new_error("TransportError", "Connection refused", { code = "ECONNREFUSED" }), 0)
      end
      refused(function() return fetch.safe_fetch(url("/"), base) end, "No vetted address could be reached",
        "UnsafeUrlError")
      assert.are.equal(2, calls)
    end)

    it("11: the real transport reaches the loopback server through the pinned address; the hostname has no DNS", function()
      local opts, log = seams()
      local ok, res = run(function() return fetch.safe_fetch(url("/echo?x=1#frag"), opts) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal(200, res.status)
      assert.are.equal(url("/echo?x=1"), res.url)
      assert.are.same({ "never-resolve.invalid" }, log.hosts)
      local head = res.data
      assert.truthy(head:find("^GET /echo%?x=1 HTTP/1%.1\r\n"))
      assert.truthy(head:find("\r\nHost: never%-resolve%.invalid:" .. server.port .. "\r\n"))
      assert.truthy(head:find("\r\naccept: text/html,application/pdf,text/plain,application/json;q=0.9,%*/%*;q=0.1\r\n"))
      assert.truthy(head:find("\r\nuser%-agent: pi%-roundtable%-sandbox\r\n"))
      assert.truthy(head:find("\r\naccept%-encoding: identity\r\n"))
      assert.truthy(head:find("\r\nconnection: close\r\n"))
    end)

    it("the caller's headers replace defaults; accept-encoding stays identity, sent once", function()
      local opts = seams { opts = { headers = { ["Accept-Encoding"] = "gzip, br", Accept = "text/plain",
        ["X-Host-Token"] = "t1" } } }
      local ok, res = run(function() return fetch.safe_fetch(url("/echo"), opts) end)
      assert.is_true(ok, tostring(res))
      local head = res.data:lower()
      local _, n = head:gsub("\r\naccept%-encoding:", "")
      assert.are.equal(1, n)
      assert.truthy(head:find("\r\naccept%-encoding: identity\r\n"))
      assert.truthy(head:find("\r\naccept: text/plain\r\n"))
      assert.truthy(head:find("\r\nx%-host%-token: t1\r\n"))
      local _, na = head:gsub("\r\naccept:", "")
      assert.are.equal(1, na)
    end)

    it("11: pinned_transport called directly connects only to the address it is given", function()
      local ok, res = run(function()
        return fetch.pinned_transport(url("/short"), { address = "127.0.0.1", family = 4, port = server.port })
      end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("ok", res.data)
    end)

    it("a vetted IPv4-mapped address is connected as its IPv4 over AF_INET", function()
      local ok, res = run(function()
        return fetch.pinned_transport(url("/short"), { address = "::ffff:127.0.0.1", family = 6, port = server.port })
      end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("ok", res.data)
    end)

    it("12: a closed first address falls back to the live second after one lookup, in order", function()
      local dead = closed_port()
      local opts, log = seams {
        answers = { { address = PUBLIC4, family = 4 }, { address = PUBLIC4B, family = 4 } },
        ports = { [PUBLIC4] = dead },
      }
      local ok, res = run(function() return fetch.safe_fetch(url("/echo"), opts) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal(1, log.lookups)
      assert.are.equal(PUBLIC4, log.calls[1].address)
      assert.are.equal(PUBLIC4B, log.calls[2].address)
      assert.truthy(res.data:find("\r\nHost: never%-resolve%.invalid:" .. server.port .. "\r\n"))
    end)

    it("12: the default transport falls back from a refused connection (ECONNREFUSED code)", function()
      local dead = closed_port()
      local ok, err = run(function()
        return fetch.pinned_transport(url("/short"), { address = "127.0.0.1", family = 4, port = dead })
      end)
      assert.is_false(ok)
      assert.are.equal("TransportError", err.name)
      assert.are.equal("ECONNREFUSED", err.code)
    end)
  end)

  describe("TLS through the pin", function()
    local function tls_seams(extra)
      return seams { tls = true, limits = { cainfo = server.tls.ca }, opts = extra,
        answers = { { address = PUBLIC4, family = 4 }, { address = PUBLIC4B, family = 4 } } }
    end

    it("verifies the URL's hostname while the socket goes to the pinned loopback address", function()
      local opts, log = tls_seams()
      local ok, res = run(function()
        return fetch.safe_fetch(("https://models.example:%d/echo"):format(server.tls_port), opts)
      end)
      assert.is_true(ok, tostring(res))
      assert.are.equal(200, res.status)
      assert.truthy(res.data:find("\r\nHost: models%.example:" .. server.tls_port .. "\r\n"))
      assert.are.equal(1, #log.calls)
    end)

    it("a certificate for another name fails at once, with no fallback to the next address", function()
      local opts, log = tls_seams()
      local ok, err = run(function()
        return fetch.safe_fetch(("https://other.example:%d/echo"):format(server.tls_port), opts)
      end)
      assert.is_false(ok)
      assert.are.equal("TransportError", err.name)
      assert.truthy(tostring(err):find("other.example", 1, true), tostring(err))
      assert.are.equal(1, #log.calls)
    end)

    it("an untrusted certificate fails (nothing switches verification off)", function()
      local opts = seams { tls = true }
      local ok, err = run(function()
        return fetch.safe_fetch(("https://models.example:%d/echo"):format(server.tls_port), opts)
      end)
      assert.is_false(ok)
      assert.are.equal("TransportError", err.name)
    end)

    it("18: a real https server's redirect to http is refused before the target is contacted", function()
      local opts, log = tls_seams()
      refused(function()
        return fetch.safe_fetch(("https://models.example:%d/redirect?to=http://models.example:%d/short")
          :format(server.tls_port, server.port), opts)
      end, "Redirect from HTTPS to HTTP refused")
      assert.are.equal(1, #log.calls)
    end)
  end)

  describe("redirects (items 13-18)", function()
    it("13: a same-host redirect is vetted again; a rebinding answer stops it", function()
      local opts, log = seams { answers = { { { address = PUBLIC4, family = 4 } },
        { { address = "10.0.0.1", family = 4 } } } }
      refused(function() return fetch.safe_fetch(url("/redirect?to=/short"), opts) end,
        "URL resolves to a non-public address")
      assert.are.equal(1, #log.calls)
      assert.are.equal(2, log.lookups)
    end)

    it("13: a redirect loop stops at maxRedirects with six requests", function()
      local opts, log = seams()
      refused(function() return fetch.safe_fetch(url("/loop"), opts) end,
        "Too many redirects")
      assert.are.equal(6, #log.calls)
    end)

    it("14: redirects to metadata, file: and [::1] are refused after one transport call", function()
      for _, c in ipairs {
        { "http://169.254.169.254/latest/meta-data", "URL resolves to a non-public address" },
        { "file:///etc/passwd", "Only credential-free HTTP(S) URLs are allowed" },
        { "http://[::1]/", "URL resolves to a non-public address" },
      } do
        local opts, log = seams()
        refused(function() return fetch.safe_fetch(url("/redirect?to=" .. c[1]), opts) end, c[2])
        assert.are.equal(1, #log.calls, c[1])
      end
    end)

    it("15: maxRedirects = 0 refuses the first redirect", function()
      local opts = seams { opts = { maxRedirects = 0 } }
      refused(function() return fetch.safe_fetch(url("/redirect?to=/short"), opts) end, "Too many redirects")
    end)

    it("16: followRedirects = false returns the redirect; the next hop is still vetted", function()
      local opts, log = seams { opts = { followRedirects = false, headers = { ["User-Agent"] = "host-agent/1" } } }
      local ok, res = run(function() return fetch.safe_fetch(url("/redirect?to=/short"), opts) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal(302, res.status)
      assert.are.equal("Found", res.statusText)
      assert.are.equal("/short", res.headers.location)
      assert.are.equal("", res.data)
      assert.are.equal("host-agent/1", log.calls[1].headers["user-agent"])
      local opts2, log2 = seams { answers = { { address = "127.0.0.1", family = 4 } } }
      local next_url = res.url:gsub("/redirect.*$", res.headers.location)
      refused(function() return fetch.safe_fetch(next_url, opts2) end, "URL resolves to a non-public address")
      assert.are.equal(0, #log2.calls)
    end)

    it("17: a cross-origin redirect drops the caller's headers; a same-origin one keeps them", function()
      local opts, log = seams { opts = { headers = { ["X-Trusted"] = "secret" } } }
      local ok, res = run(function()
        return fetch.safe_fetch(url("/redirect?to=" .. url("/redirect?to=/short", "other.example")), opts)
      end)
      assert.is_true(ok, tostring(res))
      assert.are.equal(3, #log.calls)
      assert.are.equal("secret", log.calls[1].headers["x-trusted"])
      assert.is_nil(log.calls[2].headers["x-trusted"])
      assert.is_nil(log.calls[3].headers["x-trusted"])
      assert.are.equal("pi-roundtable-sandbox", log.calls[2].headers["user-agent"])
      opts, log = seams { opts = { headers = { ["X-Trusted"] = "secret" } } }
      ok, res = run(function() return fetch.safe_fetch(url("/redirect?to=/echo"), opts) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("secret", log.calls[2].headers["x-trusted"])
      assert.truthy(res.data:find("\r\nX%-Trusted: secret\r\n") or res.data:find("\r\nx%-trusted: secret\r\n"))
    end)

    it("18: an https -> http redirect is refused before any attempt against the target", function()
      local calls = 0
      refused(function()
        return fetch.safe_fetch("https://secure.example/start", {
          resolve = function() return { { address = PUBLIC4, family = 4 } } end,
          localAddresses = function() return {} end,
          transport = function(u)
            calls = calls + 1
            return { url = u, status = 302, headers = { location = "http://secure.example/next" }, data = "" }
          end,
        })
      end, "Redirect from HTTPS to HTTP refused")
      assert.are.equal(1, calls)
    end)

    it("a redirect without location, or with two, is refused", function()
      refused(function() return fetch.safe_fetch(url("/redirect-none"), (seams())) end, "Redirect without location")
      refused(function() return fetch.safe_fetch(url("/redirect2"), (seams())) end, "Invalid redirect location")
    end)
  end)

  describe("bodies and deadlines (items 19-25)", function()
    it("19: a 5-byte body over maxBytes = 2 is too large", function()
      refused(function() return fetch.safe_fetch(url("/text?n=5&chunked=1"), (seams { opts = { maxBytes = 2 } })) end,
        "Response body too large", "UnsafeUrlError")
      -- with its length declared it is refused before the body is read
      refused(function() return fetch.safe_fetch(url("/text?n=5"), (seams { opts = { maxBytes = 2 } })) end,
        "Response exceeds bounds", "ResponseTooLargeError")
      local ok, res = run(function() return fetch.safe_fetch(url("/text?n=5"), (seams { opts = { maxBytes = 5 } })) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("aaaaa", res.data)
      -- a seam's oversized result is refused too
      refused(function()
        return fetch.safe_fetch(url("/"), {
          maxBytes = 2,
          resolve = function() return { { address = PUBLIC4, family = 4 } } end,
          localAddresses = function() return {} end,
          transport = function(u) return { url = u, status = 200, headers = {}, data = "12345" } end,
        })
      end, "Response body too large")
    end)

    it("bodies larger than one read arrive whole, with and without a declared length", function()
      for _, path in ipairs { "/text?n=1048576", "/text?n=300000&chunked=1" } do
        local ok, res = run(function() return fetch.safe_fetch(url(path), (seams())) end)
        assert.is_true(ok, path .. ": " .. tostring(res))
        assert.are.equal(tonumber(path:match("n=(%d+)")), #res.data)
        assert.are.equal(string.rep("a", 64), res.data:sub(-64))
      end
      refused(function() return fetch.safe_fetch(url("/text?n=300000&chunked=1"), (seams { opts = { maxBytes = 299999 } })) end,
        "Response body too large")
    end)

    it("20: gzip, deflate and Brotli pages decode under a 200-byte cap; bombs are refused", function()
      for path, body in pairs { ["/gzip"] = "hello gzip page", ["/br"] = "hello br page",
        ["/deflate"] = "hello deflate page", ["/deflate-raw"] = "hello deflate-raw page",
        ["/gzip-multi"] = "hello multi page" } do
        local ok, res = run(function() return fetch.safe_fetch(url(path), (seams { opts = { maxBytes = 200 } })) end)
        assert.is_true(ok, path .. ": " .. tostring(res))
        assert.are.equal(body, res.data)
        assert.is_nil(res.headers["content-encoding"])
      end
      for _, path in ipairs { "/bomb-gzip", "/bomb-br" } do
        refused(function() return fetch.safe_fetch(url(path), (seams { opts = { maxBytes = 200 } })) end,
          "Response body too large", "UnsafeUrlError")
      end
    end)

    it("20: corrupt, trailing and truncated streams fail to decode; other encodings are refused", function()
      for _, path in ipairs { "/gzip-corrupt", "/gzip-trailing", "/gzip-truncated" } do
        refused(function() return fetch.safe_fetch(url(path), (seams())) end,
          "Response body could not be decoded", "DecodeError")
      end
      for _, path in ipairs { "/zstd", "/stacked" } do
        refused(function() return fetch.safe_fetch(url(path), (seams())) end,
          "Response exceeds bounds or uses unsupported encoding", "UnsafeUrlError")
      end
    end)

    it("21: the reason phrase and the server's content-length survive; decoded bodies carry none", function()
      local ok, res = run(function() return fetch.safe_fetch(url("/short"), (seams())) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("Short and Stout", res.statusText)
      assert.are.equal("2", res.headers["content-length"])
      ok, res = run(function() return fetch.safe_fetch(url("/chunked"), (seams())) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("hello chunked", res.data)
      assert.is_nil(res.headers["content-length"])
      ok, res = run(function() return fetch.safe_fetch(url("/gzip"), (seams())) end)
      assert.is_true(ok, tostring(res))
      assert.is_nil(res.headers["content-length"])
    end)

    it("22: a declared length over the cap raises ResponseTooLargeError with status and headers", function()
      local err = refused(function() return fetch.safe_fetch(url("/declared"), (seams { opts = { maxBytes = 1000 } })) end,
        "Response exceeds bounds", "ResponseTooLargeError")
      assert.are.equal(200, err.status)
      assert.are.equal("5000", err.headers["content-length"])
      assert.is_true(fetch.is_unsafe_url_error(err))
    end)

    it("oversized header blocks are refused (120 fields; a 70 KiB field)", function()
      for _, path in ipairs { "/many-headers", "/huge-head" } do
        refused(function() return fetch.safe_fetch(url(path), (seams())) end, "Response header block too large")
      end
    end)

    it("an HTTP/0.9 reply fails as a TransportError", function()
      local err = refused(function() return fetch.safe_fetch(url("/http09"), (seams())) end,
        "Received HTTP/0.9 when not allowed")
      assert.are.equal("TransportError", err.name)
    end)

    it("23: a resolver that never answers fails on time with 'Fetch deadline exceeded'", function()
      local t0 = core.now()
      refused(function()
        return fetch.safe_fetch(url("/"), { timeoutMs = 10, resolve = never_answers,
          localAddresses = function() return {} end })
      end, "Fetch deadline exceeded", "TimeoutError")
      assert.is_true(core.now() - t0 < 500)
    end)

    it("24: a server that stalls after its head is cut by the idle timeout before the deadline", function()
      local t0 = core.now()
      local opts = seams { opts = { timeoutMs = 5000, idleTimeoutMs = 200 },
        limits = { idleTimeoutMs = 200, deadline = core.now() + 5000 } }
      refused(function() return fetch.safe_fetch(url("/stall"), opts) end,
        "Response idle timeout exceeded", "UnsafeUrlError")
      assert.is_true(core.now() - t0 < 3000)
    end)

    it("24: the default transport applies idleTimeoutMs itself", function()
      local t0 = core.now()
      refused(function()
        return fetch.safe_fetch(url("/stall", "127.0.0.1"), { timeoutMs = 5000, idleTimeoutMs = 150 })
      end, "URL resolves to a non-public address")
      -- the real transport against the stalling loopback server, pinned directly
      refused(function()
        return fetch.pinned_transport(url("/stall"), { address = "127.0.0.1", family = 4, port = server.port },
          nil, 1000, {}, { idleTimeoutMs = 150, deadline = core.now() + 5000 })
      end, "Response idle timeout exceeded")
      assert.is_true(core.now() - t0 < 3000)
    end)

    it("a slow-drip body that never goes idle is cut by the whole-call deadline", function()
      local t0 = core.now()
      refused(function()
        return fetch.safe_fetch(url("/drip"), (seams { opts = { timeoutMs = 400, idleTimeoutMs = 300 } }))
      end, "Fetch deadline exceeded", "TimeoutError")
      assert.is_true(core.now() - t0 < 2000)
    end)

    it("the deadline also stops a transport seam stuck on a stalled server (its signal aborts)", function()
      local t0 = core.now()
      local seen
      local opts = seams { opts = { timeoutMs = 300 }, limits = { idleTimeoutMs = 60000 } }
      local inner = opts.transport
      opts.transport = function(u, address, sig, ...)
        seen = sig
        return inner(u, address, sig, ...)
      end
      refused(function() return fetch.safe_fetch(url("/stall"), opts) end, "Fetch deadline exceeded", "TimeoutError")
      assert.is_true(core.now() - t0 < 2000)
      assert.is_true(seen.aborted)
    end)

    it("25: an aborted signal ends the call with the signal's own reason", function()
      local sig = signal.new()
      local ok, err = run(function()
        core.timer(20, function() sig:abort("turn ended") end)
        return fetch.safe_fetch(url("/"), { signal = sig, resolve = never_answers,
          localAddresses = function() return {} end })
      end)
      assert.is_false(ok)
      assert.are.equal(signal.AbortError, err)
      -- already aborted: nothing is looked up
      local opts, log = seams { opts = { signal = sig } }
      ok, err = run(function() return fetch.safe_fetch(url("/echo"), opts) end)
      assert.is_false(ok)
      assert.are.equal(signal.AbortError, err)
      assert.are.equal(0, log.lookups)
    end)
  end)

  describe("assert_public_url (items 26-27)", function()
    local function check_opts(answers)
      return { resolve = function() return answers end, localAddresses = function() return {} end }
    end

    it("26: returns the canonical URL; refuses other schemes, bare paths, credentials and mixed answers", function()
      local ok, res = run(function()
        return fetch.assert_public_url("HTTP://Example.ORG:80/a/../b?q=1#frag",
          check_opts { { address = PUBLIC4, family = 4 } })
      end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("http://example.org/b?q=1", res)
      for _, c in ipairs {
        { "file:///etc/passwd", "Only credential-free HTTP(S) URLs are allowed" },
        { "/etc/hosts", "Invalid URL" },
        { "http://u:p@ok.test/", "Only credential-free HTTP(S) URLs are allowed" },
      } do
        refused(function() return fetch.assert_public_url(c[1], check_opts { { address = PUBLIC4, family = 4 } }) end, c[2])
      end
      refused(function()
        return fetch.assert_public_url("http://ok.test/", check_opts {
          { address = PUBLIC4, family = 4 }, { address = "192.168.1.1", family = 4 } })
      end, "URL resolves to a non-public address")
      refused(function()
        return fetch.assert_public_url("http://ok.test/", { timeoutMs = 0 })
      end, "Invalid fetch bounds")
    end)

    it("27: a resolver that never answers fails with 'URL check deadline exceeded' within timeoutMs", function()
      local t0 = core.now()
      refused(function()
        return fetch.assert_public_url("http://ok.test/", { timeoutMs = 50, resolve = never_answers,
          localAddresses = function() return {} end })
      end, "URL check deadline exceeded", "TimeoutError")
      assert.is_true(core.now() - t0 < 1000)
    end)
  end)
  describe("the C hop loop with its default transport (trusted testConnectTo seam)", function()
    -- no transport seam: the C core's own pinned attempt runs, sent to the
    -- loopback fixture by testConnectTo while vetting judges the answer
    local function direct(o)
      o = o or {}
      local log = { lookups = 0 }
      local opts = {
        resolve = function() log.lookups = log.lookups + 1; return o.answers or { { address = PUBLIC4, family = 4 } } end,
        localAddresses = function() return {} end,
        testConnectTo = { address = "127.0.0.1", port = server.port },
      }
      for k, v in pairs(o.opts or {}) do opts[k] = v end
      return opts, log
    end

    it("fetches through the pinned C transport with the hostname kept", function()
      local opts, log = direct { opts = { headers = { ["X-Trusted"] = "t" } } }
      local ok, res = run(function() return fetch.safe_fetch(url("/echo?q=1"), opts) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal(200, res.status)
      assert.are.equal(url("/echo?q=1"), res.url)
      assert.are.equal(1, log.lookups)
      assert.truthy(res.data:find("\r\nHost: never%-resolve%.invalid:" .. server.port .. "\r\n"))
      assert.truthy(res.data:lower():find("\r\nx%-trusted: t\r\n"))
      ok, res = run(function() return fetch.safe_fetch(url("/short"), (direct())) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("Short and Stout", res.statusText)
      assert.are.equal("ok", res.data)
    end)

    it("follows a redirect chain with a fresh lookup per hop and drops headers across origins", function()
      local opts, log = direct { opts = { headers = { ["X-Trusted"] = "t" } } }
      local ok, res = run(function()
        return fetch.safe_fetch(url("/redirect?to=" .. url("/redirect?to=/echo", "other.example")), opts)
      end)
      assert.is_true(ok, tostring(res))
      assert.are.equal(200, res.status)
      assert.are.equal(3, log.lookups)
      assert.are.equal(url("/echo", "other.example"), res.url)
      assert.is_nil(res.data:lower():find("x%-trusted"))
      refused(function() return fetch.safe_fetch(url("/loop"), (direct())) end, "Too many redirects")
      refused(function() return fetch.safe_fetch(url("/redirect2"), (direct())) end, "Invalid redirect location")
    end)

    it("applies the bounds, decoding and idle timeout in C", function()
      local err = refused(function() return fetch.safe_fetch(url("/declared"), (direct { opts = { maxBytes = 1000 } })) end,
        "Response exceeds bounds", "ResponseTooLargeError")
      assert.are.equal(200, err.status)
      assert.are.equal("5000", err.headers["content-length"])
      local ok, res = run(function() return fetch.safe_fetch(url("/gzip"), (direct { opts = { maxBytes = 200 } })) end)
      assert.is_true(ok, tostring(res))
      assert.are.equal("hello gzip page", res.data)
      assert.is_nil(res.headers["content-length"])
      refused(function() return fetch.safe_fetch(url("/bomb-br"), (direct { opts = { maxBytes = 200 } })) end,
        "Response body too large")
      refused(function() return fetch.safe_fetch(url("/stall"), (direct { opts = { idleTimeoutMs = 150 } })) end,
        "Response idle timeout exceeded", "UnsafeUrlError")
      err = refused(function() return fetch.safe_fetch(url("/http09"), (direct())) end, "Received HTTP/0.9 when not allowed")
      assert.are.equal("TransportError", err.name)
    end)

    it("a closed port is a fallback code: with every address refused, 'No vetted address could be reached'", function()
      local opts = direct { answers = { { address = PUBLIC4, family = 4 }, { address = PUBLIC4B, family = 4 } } }
      opts.testConnectTo = { address = "127.0.0.1", port = closed_port() }
      refused(function() return fetch.safe_fetch(url("/short"), opts) end, "No vetted address could be reached")
    end)

    it("the deadline and the caller's signal end a transfer in flight", function()
      local t0 = core.now()
      refused(function() return fetch.safe_fetch(url("/drip"), (direct { opts = { timeoutMs = 300 } })) end,
        "Fetch deadline exceeded", "TimeoutError")
      assert.is_true(core.now() - t0 < 2000)
      local sig = signal.new()
      local ok, err = run(function()
        core.timer(100, function() sig:abort("turn ended") end)
        return fetch.safe_fetch(url("/stall"), (direct { opts = { signal = sig } }))
      end)
      assert.is_false(ok)
      assert.are.equal(signal.AbortError, err)
    end)

    it("a bad testConnectTo is refused as a bound", function()
      local opts = direct()
      opts.testConnectTo = { address = "localhost", port = 1 }
      refused(function() return fetch.safe_fetch(url("/short"), opts) end, "Invalid fetch bounds")
    end)
  end)
end)
