-- netaddr_spec.lua: the pure half of the safe-fetch SSRF guard (core/netaddr.c;
-- shared/spec/fetch-and-delegation.md 1.5 URL admission, 1.6 address policy,
-- 1.15 messages, and the address/URL items of section 5). Every range of the
-- 1.6 tables is checked at its first and last address and, where they are
-- public, at the neighbours just outside. No network: all of this is pure.
local core = require "sandbox.core"

local INVALID = "Invalid URL"
local CREDS = "Only credential-free HTTP(S) URLs are allowed"
local PORT0 = "Port 0 is not allowed"
local LOCATION = "Invalid redirect location"

local function public(text, ...)
  local ok, why = core.addr_classify(text, ...)
  assert.are.equal("public", ok, text .. " should be public, got " .. tostring(why))
end

local function refused(text, ...)
  local ok, why = core.addr_classify(text, ...)
  assert.is_nil(ok, text .. " should be refused")
  assert.is_string(why)
  return why
end

local function admit(url)
  local u, err = core.url_admit(url)
  assert.is_nil(err, ("%q: %s"):format(url, tostring(err)))
  assert.is_table(u)
  -- the canonical form is admitted again, identically
  local again = assert(core.url_admit(u.href))
  assert.are.equal(u.href, again.href)
  assert.are.equal(u.host, again.host)
  assert.are.equal(u.port, again.port)
  return u
end

local function admit_err(url, want)
  local u, err = core.url_admit(url)
  assert.is_nil(u, ("%q should be refused"):format(url))
  assert.are.equal(want, err, url)
end

-- ---- IPv4 helpers (an independent copy of the 1.6 table) ------------------

local function quad(n)
  return ("%d.%d.%d.%d"):format(n >> 24 & 255, n >> 16 & 255, n >> 8 & 255, n & 255)
end

local function parse_quad(s)
  local a, b, c, d = s:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  return (tonumber(a) << 24) | (tonumber(b) << 16) | (tonumber(c) << 8) | tonumber(d)
end

local V4 = {
  { "0.0.0.0", 8, "this network" },
  { "10.0.0.0", 8, "private" },
  { "100.64.0.0", 10, "shared/CGNAT" },
  { "127.0.0.0", 8, "loopback" },
  { "169.254.0.0", 16, "link-local" },
  { "172.16.0.0", 12, "private" },
  { "192.0.0.0", 24, "IETF protocol assignments" },
  { "192.0.2.0", 24, "TEST-NET-1" },
  { "192.88.99.0", 24, "6to4 relay anycast" },
  { "192.168.0.0", 16, "private" },
  { "198.18.0.0", 15, "benchmarking" },
  { "198.51.100.0", 24, "TEST-NET-2" },
  { "203.0.113.0", 24, "TEST-NET-3" },
  { "224.0.0.0", 3, "multicast and reserved" },
}

local function v4_bounds(row)
  local first = parse_quad(row[1])
  return first, first + (1 << (32 - row[2])) - 1
end

local function v4_listed(n)
  for _, row in ipairs(V4) do
    local lo, hi = v4_bounds(row)
    if n >= lo and n <= hi then return true end
  end
  return false
end

local function mapped_hex(n)
  return ("::ffff:%x:%x"):format(n >> 16, n & 0xffff)
end

describe("address policy: IPv4 deny-list (1.6)", function()
  for _, row in ipairs(V4) do
    local lo, hi = v4_bounds(row)
    it(("refuses %s/%d (%s) at both edges"):format(row[1], row[2], row[3]), function()
      for _, n in ipairs { lo, hi } do
        refused(quad(n))
        refused("::ffff:" .. quad(n))
        refused(mapped_hex(n))
        refused("[::ffff:" .. quad(n) .. "]")
        refused(quad(n), 443)
      end
    end)
    it(("accepts the public neighbours of %s/%d"):format(row[1], row[2]), function()
      for _, n in ipairs { lo - 1, hi + 1 } do
        if n >= 0 and n <= 0xffffffff and not v4_listed(n) then
          public(quad(n))
          public("::ffff:" .. quad(n))
          public(mapped_hex(n))
          public(quad(n), 443)
        end
      end
    end)
  end

  it("states the edges the spec names", function()
    for _, a in ipairs { "100.63.255.255", "100.128.0.1", "172.15.255.255", "172.32.0.1",
                         "198.20.0.1", "192.0.1.1", "8.8.8.8", "1.1.1.1", "223.255.255.255" } do
      public(a)
    end
    for _, a in ipairs { "198.19.255.255", "255.255.255.255", "100.100.100.200", "169.254.169.254",
                         "169.254.0.23", "192.0.0.192", "192.0.0.170", "192.0.0.171", "240.0.0.1" } do
      refused(a)
    end
  end)

  it("names the range in the reason", function()
    assert.matches("loopback", refused("127.0.0.1"))
    assert.matches("169.254.0.0/16", refused("169.254.169.254"))
    assert.matches("100.64.0.0/10", refused("100.100.100.200"))
  end)
end)

describe("address policy: IPv6 allow-list (1.6)", function()
  local FULL = ":ffff:ffff:ffff:ffff:ffff:ffff"
  -- { first, last, lower neighbour or false, upper neighbour or false }
  local holes = {
    { "2002::", "2002" .. FULL .. ":ffff", "2001:ffff" .. FULL, "2003::" },                -- 6to4
    { "2001::", "2001:0" .. FULL, "2000:ffff" .. FULL, "2001:1::" },                        -- Teredo
    { "2001:2::", "2001:2" .. FULL, "2001:1" .. FULL, "2001:3::" },                          -- benchmarking
    { "2001:db8::", "2001:db8" .. FULL, "2001:db7" .. FULL, "2001:db9::" },                  -- documentation
    { "2001:10::", "2001:2f" .. FULL, "2001:f" .. FULL, "2001:30::" },                       -- ORCHID, ORCHIDv2
    { "2001:1f::1", "2001:20::", false, false },                                             -- the /28 seam
    { "3fff::", "3fff" .. FULL .. ":ffff", "3ffe" .. FULL .. ":ffff", false },               -- documentation
  }
  for _, h in ipairs(holes) do
    it("refuses " .. h[1] .. " … " .. h[2] .. " and accepts what is just outside", function()
      refused(h[1])
      refused(h[2])
      if h[3] then public(h[3]) end
      if h[4] then public(h[4]) end
    end)
  end

  it("accepts 2000::/3 from its first to its last address, and nothing around it", function()
    public("2000::")
    public("2000::1")
    public("3ffe" .. FULL .. ":ffff")
    refused("1fff" .. FULL .. ":ffff")
    refused("4000::")
  end)

  it("refuses everything outside 2000::/3 with no special cases", function()
    for _, a in ipairs { "::", "::1", "::7f00:1", "::127.0.0.1", "::8.8.8.8", "64:ff9b::808:808",
                         "64:ff9b::7f00:1", "64:ff9b::8.8.8.8", "64:ff9b:1::1", "64:ff9b:1:ffff::1",
                         "100::", "100::ffff:ffff:ffff:ffff", "fc00::1", "fd00:ec2::254",
                         "fdff" .. FULL .. ":ffff", "fe80::1", "febf" .. FULL .. ":ffff",
                         "fec0::1", "feff::1", "ff00::", "ff02::1", "ff" .. FULL:sub(2) .. ":ffff:ffff",
                         "5f00::1", "4000::1", "8000::1", "1::", "1fff::1", "::ffff:0:7f00:1",
                         "::ffff:0:808:808", "0:0:0:0:ffff:0:808:808" } do
      refused(a)
    end
  end)

  it("judges IPv4-mapped addresses by their IPv4, in every spelling", function()
    public("::ffff:8.8.8.8")
    public("::ffff:808:808")
    public("0:0:0:0:0:ffff:808:808")
    public("::FFFF:8.8.8.8")
    refused("::ffff:127.0.0.1")
    refused("::ffff:a9fe:a9fe")
    refused("::ffff:0:1")
    refused("0:0:0:0:0:ffff:7f00:1")
  end)

  it("refuses the transition forms whatever public IPv4 they embed", function()
    assert.matches("6to4", refused("2002:808:808::"))          -- 6to4 of 8.8.8.8
    assert.matches("Teredo", refused("2001:0:4136:e378:8000:63bf:3fff:fdd2"))
    assert.matches("NAT64", refused("64:ff9b::808:808"))
    assert.matches("IPv4%-compatible", refused("::808:808"))
  end)

  it("accepts the listed public examples inside 2000::/3", function()
    for _, a in ipairs { "2001:30::1", "2001:1::1", "2001:3::1", "2001:4:112::1", "2001:db9::",
                         "2620:4f:8000::1", "2001:4860:4860::8888", "2606:4700:4700::1111",
                         "2001:4860:0:1::5efe:7f00:1", "2a00:1450:4001:82b::200e" } do
      public(a)
    end
  end)

  it("compares hextets numerically, so compressed spellings are caught", function()
    refused("2001::1")
    refused("2001:0000:0000:0000:0000:0000:0000:0001")
    refused("2001:0::abcd:1")
    refused("2001:DB8::1")
  end)
end)

describe("address policy: strict literals only (1.6, section 5 items 1-3)", function()
  it("refuses the section 5 item 1 list", function()
    for _, a in ipairs { "127.0.0.1", "10.2.3.4", "172.31.1.1", "169.254.169.254", "192.168.1.1",
                         "100.64.0.1", "0.0.0.0", "224.0.0.1", "198.18.0.1", "192.0.2.1", "192.0.0.9",
                         "::1", "::", "fc00::1", "fe80::1", "::ffff:127.0.0.1", "0:0:0:0:0:ffff:7f00:1",
                         "2001:db8::1", "2002:7f00:1::", "2001::1", "2001::abcd:1",
                         "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:10::1", "2001:2f::1",
                         "64:ff9b::7f00:1", "::ffff:169.254.169.254" } do
      refused(a)
    end
  end)

  it("accepts the section 5 item 2 list", function()
    for _, a in ipairs { "8.8.8.8", "1.1.1.1", "192.0.1.1", "2606:4700:4700::1111",
                         "2001:4860:4860::8888", "2001:30::1", "::ffff:8.8.8.8" } do
      public(a)
    end
  end)

  it("refuses a zone id, a leading-zero quad and any non-literal text", function()
    for _, a in ipairs { "fe80::1%eth0", "2606:4700:4700::1111%1", "[2001:4860:4860::8888%25en0]",
                         "08.8.8.8", "8.8.8.08", "010.8.8.8", "::ffff:08.8.8.8", "8.8.8", "8.8.8.8.",
                         "8.8.8.8.8", "0x8.8.8.8", "134744072", "256.1.1.1", "8.8.8.8 ", " 8.8.8.8",
                         "", "example.com", "localhost", "[]", "2001:4860::8888::1", "2001:4860:4860::88888",
                         "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7", ":1::", "1::2:", "::ffff:1.2.3",
                         "1:2:3:4:5:6:7:1.2.3.4", "::ffff:1.2.3.4.5", "2001:4860:4860::8888/64",
                         ("1"):rep(100) } do
      local ok, why = core.addr_classify(a)
      assert.is_nil(ok, a)
      assert.are.equal("not a strict IP literal", why, a)
    end
  end)

  it("lower-cases and strips one pair of brackets", function()
    public("[2606:4700:4700::1111]")
    public("2606:4700:4700::1111")
    public(("2606:4700:4700::1111"):upper())
    refused("[::1]")
  end)

  it("refuses port 0 and accepts every other port", function()
    assert.are.equal("port 0", refused("8.8.8.8", 0))
    assert.are.equal("port 0", refused("2001:4860:4860::8888", 0))
    public("8.8.8.8", 1)
    public("8.8.8.8", 65535)
    public("2001:4860:4860::8888", 8443)
    assert.has_error(function() core.addr_classify("8.8.8.8", 65536) end)
    assert.has_error(function() core.addr_classify("8.8.8.8", -1) end)
  end)

  it("canonicalises literals (addr_parse)", function()
    assert.are.same({ "::ffff:7f00:1", 6 }, { core.addr_parse("0:0:0:0:0:FFFF:127.0.0.1") })
    assert.are.same({ "8.8.8.8", 4 }, { core.addr_parse("8.8.8.8") })
    assert.are.same({ "2001:db8::1:0:0:1", 6 }, { core.addr_parse("2001:db8:0:0:1:0:0:1") })
    assert.are.same({ "2001:0:0:1::1", 6 }, { core.addr_parse("2001:0:0:1:0:0:0:1") })
    assert.are.same({ "1:0:1:0:1:0:1:0", 6 }, { core.addr_parse("1:0:1:0:1:0:1:0") })
    assert.are.same({ "::", 6 }, { core.addr_parse("0:0:0:0:0:0:0:0") })
    assert.is_nil((core.addr_parse("01.1.1.1")))
  end)
end)

describe("address policy: the host's own addresses (1.6, section 5 item 4)", function()
  it("refuses a public candidate listed as the host's own, on every port", function()
    assert.are.equal("host's own address", refused("8.8.8.8", 443, { "8.8.8.8" }))
    assert.are.equal("host's own address", refused("8.8.8.8", 8080, { "1.1.1.1", "8.8.8.8" }))
    assert.are.equal("host's own address",
      refused("2001:4860:4860::8888", 443, { "2001:4860:4860:0:0:0:0:8888" }))
    public("8.8.4.4", 443, { "8.8.8.8" })
    public("8.8.8.8", 443, {})
  end)

  it("compares an IPv4-mapped candidate by its IPv4", function()
    refused("::ffff:8.8.8.8", 443, { "8.8.8.8" })
    refused("8.8.8.8", 443, { "::ffff:808:808" })
  end)

  it("fails closed on a malformed list entry", function()
    assert.are.equal("malformed host address list", refused("8.8.8.8", 443, { "not-an-ip" }))
    assert.are.equal("malformed host address list", refused("8.8.8.8", 443, { "fe80::1%eth0" }))
    assert.are.equal("malformed host address list", refused("8.8.8.8", 443, { 42 }))
  end)
end)

describe("URL admission: encoded IPv4 and IPv6 hosts (1.5 table)", function()
  local function to_ip(host, want)
    local u = admit("http://" .. host .. "/")
    assert.is_true(u.host_is_ip, host)
    assert.are.equal(want, u.host, host)
    refused(u.host)                     -- vetting refuses it as non-public
  end

  it("normalises every spelling of 127.0.0.1 and vetting refuses it", function()
    for _, h in ipairs { "2130706433", "017700000001", "0x7f000001", "0x7f.1", "127.1", "0177.0.0.1",
                         "0x7f.0x0.0x0.0x1", "0x0000007f.0x00000000.0x00000000.0x00000001",
                         "0177.0x0.0x0.0x1", "0X7F.1", "%31%32%37.0.0.1", "127.0.0.1.", "127.0.0.1%2e",
                         "127.0.1", "0x7f.0.1" } do
      to_ip(h, "127.0.0.1")
    end
  end)

  it("normalises 0.0.0.0 and 169.254.169.254", function()
    to_ip("0", "0.0.0.0")
    to_ip("0x.0x.0x.0x", "0.0.0.0")
    to_ip("0251.0376.0251.0376", "169.254.169.254")
  end)

  it("keeps the largest legal value of each form and never wraps", function()
    to_ip("4294967295", "255.255.255.255")
    to_ip("0xffffffff", "255.255.255.255")
    to_ip("037777777777", "255.255.255.255")
    to_ip("255.16777215", "255.255.255.255")
    to_ip("255.255.65535", "255.255.255.255")
    assert.are.equal("8.8.8.8", admit("http://134744072/").host)
    public(admit("http://134744072/").host)
    for _, h in ipairs { "4294967296", "0x100000000", "040000000000", "255.16777216", "255.255.65536",
                         "1.2.3.256", "256.1.1", "99999999999999999999999", "0x" .. ("f"):rep(40) } do
      admit_err("http://" .. h .. "/", INVALID)
    end
  end)

  it("keeps a host whose last label is not a number as a domain name", function()
    local u = admit("http://1.2.3.4../")
    assert.is_false(u.host_is_ip)
    assert.are.equal("name", u.host_kind)
    assert.are.equal("1.2.3.4..", u.host)
    assert.are.equal("name", admit("http://1.2.3.4a/").host_kind)
    assert.are.equal("name", admit("http://0xg/").host_kind)
  end)

  it("refuses malformed numeric hosts with Invalid URL", function()
    for _, h in ipairs { "1.2.3.4.5", "256.0.0.1", "0x100000000", "7147006462", "0x41414141A9FEA9FE",
                         "425.510.425.510", "09.1.1.1", "1.2.3.08", "1..2.3", "foo.0x", "foo.1",
                         "08", "0x7g.1" } do
      admit_err("http://" .. h .. "/", INVALID)
    end
  end)

  it("canonicalises IPv6 literals", function()
    assert.are.equal("http://[::ffff:7f00:1]/", admit("http://[::ffff:127.0.0.1]/").href)
    assert.are.equal("http://[::ffff:7f00:1]/", admit("http://[0:0:0:0:0:ffff:127.0.0.1]/").href)
    assert.are.equal("http://[::7f00:1]/", admit("http://[::127.0.0.1]/").href)
    local u = admit("HTTP://[2001:DB8:0:0:1:0:0:1]:8080/")
    assert.are.equal("http://[2001:db8::1:0:0:1]:8080/", u.href)
    assert.are.equal("2001:db8::1:0:0:1", u.host)             -- no brackets
    assert.are.equal("ipv6", u.host_kind)
    assert.are.equal("[2001:db8::1:0:0:1]:8080", u.authority)
    assert.are.equal("https://[2001:0:0:1::1]/", admit("https://[2001:0:0:1:0:0:0:1]/").href)
    for _, h in ipairs { "[::ffff:127.0.0.1]", "[::127.0.0.1]", "[::1]", "[::ffff:7f00:1]" } do
      refused(admit("http://" .. h .. "/").host)
    end
  end)

  it("refuses zone ids, encoded brackets, names in brackets and unbracketed IPv6", function()
    for _, h in ipairs { "[fe80::1%25eth0]", "[fe80::1%eth0]", "%5B::1%5D", "[example.com]",
                         "0000::1:80", "::1", "[::1", "::1]", "[::1]x", "[]", "[::ffff:0127.0.0.1]",
                         "[1:2:3:4:5:6:7:8:9]", "[::1::]", "[12345::]" } do
      admit_err("http://" .. h .. "/", INVALID)
    end
  end)
end)

describe("URL admission: hosts (1.5 item 7)", function()
  it("refuses non-ASCII hosts: no IDNA mapping", function()
    for _, h in ipairs { "①②⑦.⓪.⓪.①", "127。0。0。1", "ＬＯＣＡＬＨＯＳＴ", "exämple.com", "ex%C3%A4mple.com" } do
      admit_err("http://" .. h .. "/", INVALID)
    end
    assert.are.equal("xn--exmple-cua.com", admit("http://xn--exmple-cua.com/").host)
  end)

  it("decodes and lower-cases", function()
    assert.are.equal("localhost", admit("http://LOCALHOST/").host)
    assert.are.equal("localhost", admit("http://loc%61lhost/").host)
    assert.are.equal("localhost", admit("http://loc%41lhost/").host)
    assert.is_false(admit("http://LOCALHOST/").host_is_ip)
  end)

  it("refuses malformed escapes, forbidden code points, empty and long hosts", function()
    for _, h in ipairs { "foo%00.example.com", "exa mple.com", "a%zz", "a%4", "a%", "%", "a%2f",
                         "a%20b", "a%25", "a%3a", "a%40b", "a%5cb", "a%7c", "a%5e", "a%3c", "a%3e",
                         "a%3f", "a%23", "a%7f", "a%09", "a<b", "a>b", "a^b", "a|b", "" } do
      admit_err("http://" .. h .. "/", INVALID)
    end
    local label = ("a"):rep(63)
    local h253 = table.concat({ label, label, label, ("b"):rep(61) }, ".")
    assert.are.equal(253, #h253)
    assert.are.equal(h253, admit("http://" .. h253 .. "/").host)
    admit_err("http://" .. h253 .. "c/", INVALID)
    admit_err("http:///path", INVALID)
    admit_err("http://:80/", INVALID)
  end)
end)

describe("URL admission: scheme, authority and port (1.5 items 1-6)", function()
  it("admits http and https only, case-insensitively", function()
    assert.are.equal("http", admit("HTTP://example.com/").scheme)
    assert.are.equal("https", admit("hTTpS://example.com/").scheme)
    for _, url in ipairs { "file:///etc/passwd", "gopher://example.test/", "ftp://example.test/",
                           "data:text/plain,hi", "javascript:alert(1)", "ws://example.test/",
                           "httpx://example.test/", "dict://127.0.0.1:11211/" } do
      admit_err(url, CREDS)
    end
  end)

  it("refuses text without a scheme, and a scheme without //", function()
    for _, url in ipairs { "/etc/hosts", "example.com", "//example.com/", "", "   ", "1http://a/",
                           "http:/example.com", "http:example.com", "http:\\\\example.com" } do
      admit_err(url, INVALID)
    end
  end)

  it("refuses userinfo, even empty", function()
    for _, url in ipairs { "http://user:password@example.test", "http://u@example.test/",
                           "http://@example.test/", "http://127.1.1.1:80@127.2.2.2:80/",
                           "https://a:b@c:d@e/", "http://%40@example.test/" } do
      admit_err(url, CREDS)
    end
  end)

  it("ends the authority at the fragment", function()
    local u = admit("http://127.1.1.1:80#@127.2.2.2:80")
    assert.are.equal("127.1.1.1", u.host)
    assert.are.equal("http://127.1.1.1/", u.href)
    refused(u.host)
    assert.are.equal("example.com", admit("http://example.com?@evil.test/").host)
  end)

  it("parses ports: leading zeros, defaults removed, no allow-list", function()
    local u = admit("http://example.com:80/")
    assert.are.equal("http://example.com/", u.href)
    assert.are.equal(80, u.port)
    assert.is_false(u.port_explicit)
    assert.are.equal("https://example.com/", admit("https://example.com:443/").href)
    assert.are.equal("https://example.com:80/", admit("https://example.com:80/").href)
    assert.are.equal("http://example.com:443/", admit("http://example.com:443/").href)
    assert.are.equal("http://example.com/", admit("http://example.com:0080/").href)
    assert.are.equal(8080, admit("http://example.com:08080/").port)
    assert.are.equal(1, admit("http://example.com:1/").port)
    assert.are.equal(65535, admit("http://example.com:65535/").port)
    assert.are.equal(22, admit("http://example.com:22/").port)
    assert.is_true(admit("http://example.com:22/").port_explicit)
    assert.are.equal(443, admit("https://example.com/").port)
    assert.are.equal(11211, admit("http://[::1]:11211/").port)
  end)

  it("refuses bad ports with Invalid URL and port 0 with its own message", function()
    for _, p in ipairs { "65536", "+11211aaa", "", "-1", "8o", "99999999999999999999", " 80", "80 ",
                         "0x50", "1:2" } do
      admit_err("http://example.com:" .. p .. "/", INVALID)
    end
    admit_err("http://example.com:0/", PORT0)
    admit_err("http://example.com:00000/", PORT0)
    admit_err("https://[2001:4860:4860::8888]:0/", PORT0)
    admit_err("http://2130706433:0/", PORT0)
    admit_err("http://exa mple.com:0/", PORT0)      -- the port is read before the host (items 6, 7)
  end)

  it("enforces UTF-8 and the 8,192-byte bound", function()
    admit_err("http://example.com/\xff", INVALID)
    admit_err("http://example.com/\xc0\xaf", INVALID)           -- overlong
    admit_err("http://example.com/\xed\xa0\x80", INVALID)       -- surrogate
    admit_err("http://example.com/\xe2\x82", INVALID)           -- truncated
    local base = "http://example.com/"
    local max = base .. ("a"):rep(8192 - #base)
    assert.are.equal(8192, #max)
    assert.are.equal(max, admit(max).href)
    admit_err(max .. "a", INVALID)
  end)

  it("trims C0 controls and spaces at the ends, refuses them inside", function()
    assert.are.equal("http://example.com/", admit(" \t\r\n\0http://example.com/ \x01\x1f").href)
    for _, url in ipairs { "http://exa\tmple.com/", "http://example.com/a\nb", "http://example.com/a\rb",
                           "http://example.com/a\0b", "http://example.com/a\x7fb", "ht\ttp://example.com/",
                           "http://example.com/?q=\x1bx", "http://example.com/#frag\tx" } do
      admit_err(url, INVALID)
    end
  end)

  it("refuses a backslash before the fragment only", function()
    for _, url in ipairs { "http://example.com\\@evil.test/", "http:\\\\example.com/", "http://example.com/a\\b",
                           "http://example.com/?a\\b" } do
      admit_err(url, INVALID)
    end
    assert.are.equal("http://example.com/a", admit("http://example.com/a#x\\y").href)
  end)
end)

describe("URL admission: path and query (1.5 item 9)", function()
  it("removes dot segments", function()
    local cases = {
      { "http://e.com/a/./b/../c", "http://e.com/a/c" },
      { "http://e.com/a/b/..", "http://e.com/a/" },
      { "http://e.com/a/b/.", "http://e.com/a/b/" },
      { "http://e.com/../../x", "http://e.com/x" },
      { "http://e.com/..", "http://e.com/" },
      { "http://e.com/a/%2e%2E/b", "http://e.com/b" },
      { "http://e.com/a/.%2e", "http://e.com/" },
      { "http://e.com/a/%2e/b", "http://e.com/a/b" },
      { "http://e.com/a//b/../c", "http://e.com/a//c" },
      { "http://e.com/a/...", "http://e.com/a/..." },
      { "http://e.com/a/..b", "http://e.com/a/..b" },
      { "http://e.com/a/../?q=../x", "http://e.com/?q=../x" },
    }
    for _, c in ipairs(cases) do assert.are.equal(c[2], admit(c[1]).href, c[1]) end
  end)

  it("percent-encodes non-ASCII and space \" < > ` { }, keeps the rest", function()
    assert.are.equal("http://e.com/a%20b%22%3C%3E%60%7B%7D?q=%20%22%3C%3E%60%7B%7D",
      admit('http://e.com/a b"<>`{}?q= "<>`{}').href)
    assert.are.equal("http://e.com/%C3%A9?x=%E2%82%AC", admit("http://e.com/é?x=€").href)
    assert.are.equal("http://e.com/a%2Fb%zz'|^[]@:!$&()*+,;=~", admit("http://e.com/a%2Fb%zz'|^[]@:!$&()*+,;=~").href)
  end)

  it("gives an empty path /, keeps an empty query, drops the fragment", function()
    local u = admit("http://e.com")
    assert.are.equal("http://e.com/", u.href)
    assert.are.equal("/", u.path_and_query)
    assert.are.equal("http://e.com/?", admit("http://e.com?").href)
    assert.are.equal("/?a=1&b=2", admit("http://e.com?a=1&b=2#f").path_and_query)
    assert.are.equal("http://e.com/p", admit("http://e.com/p#").href)
  end)

  it("returns every part the transport needs", function()
    local u = admit("https://Example.COM:8443/x/../y?z=1#frag")
    assert.are.same({
      scheme = "https", https = true, host = "example.com", port = 8443, port_explicit = true,
      path_and_query = "/y?z=1", host_is_ip = false, host_kind = "name",
      href = "https://example.com:8443/y?z=1", authority = "example.com:8443",
      origin = "https://example.com:8443",
    }, u)
  end)

  it("refuses a canonical form longer than the input bound", function()
    local url = "http://e.com/" .. (" "):rep(4000) .. "x"
    admit_err(url, INVALID)       -- 4,000 spaces become 12,000 bytes
  end)
end)

describe("URL admission: section 5 item 5 and 6", function()
  it("refuses or normalises to a non-public literal", function()
    admit_err("file:///etc/passwd", CREDS)
    admit_err("gopher://example.test/", CREDS)
    admit_err("http://user:password@example.test", CREDS)
    for _, url in ipairs { "http://2130706433", "http://0x7f000001", "http://0177.0.0.1",
                           "http://[::ffff:7f00:1]" } do
      local u = admit(url)
      assert.is_true(u.host_is_ip)
      refused(u.host, u.port)
    end
  end)

  it("refuses an explicit port 0 before anything else looks at the host", function()
    admit_err("http://example.test:0/", PORT0)
  end)
end)

-- Redirect targets are resolved by the live hop loop (sbx_fetch_start,
-- core/fetch_call.c): a transport seam answers the first hop with a 302 to
-- `ref` and records the URL of the hop that follows. No network.
describe("redirect targets (1.11 item 5)", function()
  local async = require "sandbox.async"
  local fetch = require "sandbox.fetch"
  local base = "http://a.example/dir/page?x=1#f"

  -- One redirect from base to ref: the next hop's URL, or nil and the error
  -- message; also how many attempts ran.
  local function follow(ref, from)
    local hops = {}
    local ok, err = async.run(function()
      return pcall(fetch.safe_fetch, from or base, {
        resolve = function() return { { address = "93.184.216.34", family = 4 } } end,
        localAddresses = function() return {} end,
        transport = function(u)
          hops[#hops + 1] = u
          if #hops == 1 then return { url = u, status = 302, headers = { location = ref }, data = "" } end
          return { url = u, status = 200, headers = {}, data = "" }
        end,
      })
    end)
    if ok then return hops[2], nil, #hops end
    return nil, tostring(err), #hops
  end
  local function resolve(ref, from) return assert(follow(ref, from)) end
  local function refused_as(want, ref)
    local next_url, err, attempts = follow(ref)
    assert.is_nil(next_url, ref)
    assert.are.equal(want, err, ref)
    assert.are.equal(1, attempts, ref)
  end

  it("resolves every reference form against the base", function()
    assert.are.equal("http://b.example/", resolve("http://b.example"))
    assert.are.equal("https://b.example/", resolve("https://b.example", "https://a.example/dir/page?x=1#f"))
    assert.are.equal("http://b.example/p", resolve("//b.example/p"))
    assert.are.equal("http://a.example/abs", resolve("/abs"))
    assert.are.equal("http://a.example/dir/rel", resolve("rel"))
    assert.are.equal("http://a.example/other", resolve("../other"))
    assert.are.equal("http://a.example/dir/page?y=2", resolve("?y=2"))
    assert.are.equal("http://a.example/dir/page?x=1", resolve("#g"))
    assert.are.equal("http://a.example/dir/page?x=1", resolve(" "))   -- empty once trimmed
    assert.are.equal("http://a.example/dir/", resolve("."))
    assert.are.equal("http://a.example/dir/a%20b", resolve(" a b "))
  end)

  it("keeps the admission message of a refused target", function()
    refused_as(CREDS, "file:///etc/passwd")
    refused_as(CREDS, "//u:p@b.example/")
    refused_as(PORT0, "//b.example:0/")
  end)

  it("gives Invalid redirect location for what cannot be parsed", function()
    for _, ref in ipairs { "http://[zz]/", "http:/x", "/a\\b", "//exa mple/", "http://b.example/\nx",
                           "\xff", ("a"):rep(9000) } do
      refused_as(LOCATION, ref)
    end
  end)

  it("vets the resolved literal like any other host, before any attempt against it", function()
    refused_as("URL resolves to a non-public address", "http://169.254.169.254/latest/meta-data")
    refused_as("URL resolves to a non-public address", "http://[::1]/")
    refused_as("URL resolves to a non-public address", "http://0251.0376.0251.0376/")
  end)
end)
