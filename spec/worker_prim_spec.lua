-- worker_prim_spec.lua: the worker's C side (worker/PRIMITIVES.md,
-- spec/worker.md sections 1, 1.1, 2.2, 3, 4, 6, 7.7): every sbxw primitive
-- through the loadable module build/worker/sbxw.so, the HTTP client against a
-- byte-exact fake peer (build/worker/sbxw-test-peer) and a real broker
-- (`build/sbx broker`), and the static binary's Lua environment and
-- fail-closed exits through the probe build (spec/fixtures/sbxw_probe) and
-- the host build of the real worker Lua.

-- The build this run uses: build-asan/ under the sanitizer suite, else build/.
local B = package.cpath:match("(build%-asan)/") or "build"
package.cpath = B .. "/worker/?.so;" .. package.cpath
local w = require "sbxw"
local spec_fs = require "spec_fs"

local FAILED = '{"ok":false,"text":"The sandbox worker failed."}'

local sh, read, write, mode = spec_fs.sh, spec_fs.read, spec_fs.write, spec_fs.mode

local function tmpdir() return spec_fs.tmpdir("sbxw-spec") end

local function rmdir(dir) spec_fs.rmdir(dir, "sbxw-spec") end

local function sleep(s) os.execute("sleep " .. s) end

-- Runs a command with stdin from a file; returns stdout, stderr, exit code.
local function run(dir, cmd, stdin, env)
  write(dir .. "/stdin", stdin or "")
  local prefix = env and ("env " .. env .. " ") or ""
  local code = sh(prefix .. cmd .. " <'" .. dir .. "/stdin' >'" .. dir .. "/stdout' 2>'"
    .. dir .. "/stderr'; echo $?")
  return read(dir .. "/stdout"), read(dir .. "/stderr"), tonumber(code)
end

describe("sbxw JSON (core/json.c compiled in)", function()
  it("decodes strictly: arrays, objects, null and member order survive a round trip", function()
    local text = '{"b":[],"a":{},"n":null,"z":[1,"x",true]}'
    local v = assert(w.json_decode(text))
    assert.equal(w.json_null, v.n)
    assert.equal(w.json_array_mt, getmetatable(v.b))
    assert.equal(w.json_object_mt, getmetatable(v.a))
    assert.same({ "b", "a", "n", "z" }, w.json_order[v])
    assert.equal(text, w.json_encode(v))
  end)

  it("refuses a BOM, lone surrogates, repeated names, trailing bytes, invalid UTF-8 and depth 65", function()
    local bad = { "\239\187\191{}", '"\\ud800"', '"\\udc00x"', '{"a":1,"a":2}', "[] x",
      '"\255"', "[1,]", "01", "1e999" }
    for _, s in ipairs(bad) do
      local v, err = w.json_decode(s)
      assert.is_nil(v, s)
      assert.equal("invalid json", err)
    end
    assert.truthy(w.json_decode(string.rep("[", 64) .. string.rep("]", 64)))
    assert.same({ nil, "too deep" }, { w.json_decode(string.rep("[", 65) .. string.rep("]", 65)) })
    assert.equal("\u{1F600}", w.json_decode('"\\ud83d\\ude00"'))
  end)

  it("encodes strings per worker.md 3.2: / DEL U+2028 U+2029 raw, lowercase \\u00xx", function()
    local s = "a/b\127\u{2028}\u{2029}\31\0\"\\\b\f\n\r\t"
    assert.equal('"a/b\127\u{2028}\u{2029}\\u001f\\u0000\\"\\\\\\b\\f\\n\\r\\t"', w.json_encode(s))
    assert.same({ nil, "invalid utf-8" }, { w.json_encode("\192\128") })
  end)

  it("encodes numbers: exact integers within 2^53, round-tripping doubles, finite only", function()
    assert.equal("9007199254740992", w.json_encode(2 ^ 53))
    assert.equal("-9007199254740992", w.json_encode(-(2 ^ 53)))
    assert.equal("3", w.json_encode(3.0))
    assert.equal("0.1", w.json_encode(0.1))
    assert.equal("0.3333333333333333", w.json_encode(1 / 3))
    assert.equal("1e+300", w.json_encode(1e300))
    assert.equal(2 ^ 53 + 2, tonumber(w.json_encode(2 ^ 53 + 2)))
    for _, x in ipairs({ 0.1, 1 / 3, 123456.789e-10, 5e-324, 1.7976931348623157e308 }) do
      assert.equal(x, w.json_decode(w.json_encode(x)))
    end
    assert.same({ nil, "invalid value" }, { w.json_encode(0 / 0) })
    assert.same({ nil, "invalid value" }, { w.json_encode(math.huge) })
  end)

  it("bounds the output and keeps plain tables apart: sequences are arrays, {} an object", function()
    assert.equal('[1,2]', w.json_encode({ 1, 2 }))
    assert.equal('{}', w.json_encode({}))
    assert.equal('[]', w.json_encode(setmetatable({}, w.json_array_mt)))
    assert.same({ nil, "too large" }, { w.json_encode("abcdef", 4) })
  end)
end)

describe("sbxw UTF-8 text (worker.md 3.3)", function()
  it("validates, counts and takes prefixes by code point", function()
    assert.is_true(w.utf8_valid("héllo 世界 \u{1F600}"))
    assert.is_false(w.utf8_valid("\237\160\128"))        -- surrogate
    assert.is_false(w.utf8_valid("\224\128\128"))        -- overlong
    assert.equal(8, w.utf8_len("héllo 世界"))
    assert.equal("hé", w.utf8_prefix("héllo", 2))
    assert.equal("世", w.utf8_prefix("世界", 1))
    assert.equal("ab", w.utf8_prefix("ab", 10))
    assert.equal("", w.utf8_prefix("ab", 0))
    assert.same({ nil, "invalid utf-8" }, { w.utf8_len("\255") })
    assert.same({ nil, "invalid utf-8" }, { w.utf8_prefix("a\255", 1) })
  end)

  it("trims exactly the whitespace set of 3.3 at both ends", function()
    local set = { "\t", "\n", "\v", "\f", "\r", " ", "\u{A0}", "\u{1680}", "\u{2000}", "\u{2005}",
      "\u{200A}", "\u{2028}", "\u{2029}", "\u{202F}", "\u{205F}", "\u{3000}", "\u{FEFF}" }
    local all = table.concat(set)
    assert.equal("a \u{3000} b", w.trim(all .. "a \u{3000} b" .. all))
    assert.equal("x", w.trim("\u{3000}\u{FEFF}x\u{FEFF}\u{3000}"))
    assert.equal("", w.trim(all))
    -- not in the set: NEL, zero width space, Mongolian vowel separator
    for _, c in ipairs({ "\u{85}", "\u{200B}", "\u{180E}" }) do
      assert.equal(c .. "x" .. c, w.trim(c .. "x" .. c))
    end
    assert.same({ nil, "invalid utf-8" }, { w.trim(" \255 ") })
  end)

  it("lowercases with the simple mapping, one code point to one", function()
    assert.equal("àéî", w.lower("ÀÉÎ"))
    assert.equal("i", w.lower("İ"))                      -- U+0130, simple mapping U+0069
    assert.equal("σασ", w.lower("ΣΑΣ"))                  -- no final-sigma rule
    assert.equal("ⱥ", w.lower("Ⱥ"))                      -- 2 bytes become 3
    assert.equal("k", w.lower("\u{212A}"))               -- Kelvin sign
    assert.equal("ǆ", w.lower("ǅ"))
    assert.equal("ß", w.lower("ẞ"))
    assert.equal("\u{10428}", w.lower("\u{10400}"))      -- Deseret
    assert.equal("straße 123 _-", w.lower("STRAßE 123 _-"))
    assert.equal("already lower ÿ", w.lower("already lower ÿ"))
    assert.same({ nil, "invalid utf-8" }, { w.lower("A\255") })
  end)

  it("measures JSON string literals exactly as json_encode writes them", function()
    for _, s in ipairs({ "", "plain", 'q"\\', "\1\31\127", "é世\u{1F600}", "\n\t" }) do
      assert.equal(#w.json_encode(s), w.json_string_size(s))
    end
  end)

  it("takes the longest code-point prefix whose literal fits (promptText)", function()
    local cjk = string.rep("世", 20000)
    local p = w.json_string_prefix(cjk, 4096 - 83)
    assert.equal(4011, #p)                               -- 1,337 chars: 2 + 4011 <= 4013
    assert.is_true(w.json_string_size(p) <= 4013)
    assert.is_true(w.json_string_size(w.utf8_prefix(cjk, w.utf8_len(p) + 1)) > 4013)
    assert.equal('ab', w.json_string_prefix('ab"c', 5))   -- '"ab\""' would be 6
    assert.equal('ab"', w.json_string_prefix('ab"c', 6))
    assert.equal("", w.json_string_prefix("abc", 1))
    assert.equal("abc", w.json_string_prefix("abc", 5))
  end)
end)

describe("sbxw.local_time (worker.md 6.1)", function()
  it("formats M/D/YYYY, h:mm:ss AM|PM with midnight and noon as 12", function()
    assert.equal("1/1/1970, 12:00:00 AM", w.local_time("UTC", 0))
    assert.equal("1/1/1970, 12:00:00 PM", w.local_time("UTC", 43200))
    assert.equal("1/1/1970, 12:00:00 AM", w.local_time("UTC", 0.999))
    assert.equal("12/31/2024, 11:59:59 PM", w.local_time("UTC", 1735689599))
  end)

  it("converts in IANA zones, DST and far-future rules included", function()
    assert.equal("1/5/2026, 3:04:05 PM", w.local_time("Asia/Taipei", 1767596645))
    assert.equal("1/5/2026, 12:00:00 AM", w.local_time("Asia/Taipei", 1767542400))
    assert.equal("1/5/2026, 12:00:00 PM", w.local_time("Asia/Taipei", 1767585600))
    assert.equal("7/1/2025, 8:00:00 AM", w.local_time("America/New_York", 1751371200))
    assert.equal("1/5/2026, 2:04:05 AM", w.local_time("America/New_York", 1767596645))
    assert.equal("7/3/2100, 12:00:00 PM", w.local_time("America/New_York", 4118313600))
    assert.equal("7/1/2025, 1:00:00 PM", w.local_time("Europe/London", 1751371200))
  end)

  it("refuses names outside the pattern, missing zones and non-zone files", function()
    for _, z in ipairs({ "", "Nope/Zone", "../etc/passwd", "Asia/../UTC", "/UTC", "UTC/",
      "Asia//Taipei", "UTC ", "Asia", "zone.tab", "a\0b", string.rep("A", 256) }) do
      assert.same({ nil, "invalid time zone" }, { w.local_time(z, 0) }, z)
      assert.is_false(w.zone_valid(z), z)
    end
    assert.is_true(w.zone_valid("UTC"))
    assert.is_true(w.zone_valid("Etc/GMT+5"))
  end)

  it("leaves the host process's TZ as it was (loadable module)", function()
    local before = os.getenv("TZ")
    w.local_time("Asia/Taipei", 0)
    assert.equal(before, os.getenv("TZ"))
  end)
end)

describe("sbxw.now", function()
  it("is the wall clock in seconds with a fraction", function()
    local t = w.now()
    assert.is_true(math.abs(t - os.time()) < 2)
    assert.equal("float", math.type(t))
  end)
end)

describe("sbxw files", function()
  local dir
  before_each(function() dir = tmpdir() end)
  after_each(function() rmdir(dir) end)

  it("reads a regular file up to the cap and refuses past it", function()
    write(dir .. "/f", "0123456789")
    assert.equal("0123456789", w.read_file(dir .. "/f", 10))
    assert.same({ nil, "too large" }, { w.read_file(dir .. "/f", 9) })
    write(dir .. "/e", "")
    assert.equal("", w.read_file(dir .. "/e", 0))
  end)

  it("reports a missing file, and refuses a symlink, a directory and a FIFO", function()
    assert.same({ nil, "missing" }, { w.read_file(dir .. "/absent", 10) })
    write(dir .. "/target", "secret")
    os.execute("ln -s '" .. dir .. "/target' '" .. dir .. "/link'")
    assert.same({ nil, "not a regular file" }, { w.read_file(dir .. "/link", 100) })
    assert.same({ nil, "not a regular file" }, { w.read_file(dir, 100) })
    os.execute("mkfifo '" .. dir .. "/fifo'")
    assert.same({ nil, "not a regular file" }, { w.read_file(dir .. "/fifo", 100) })
  end)

  it("writes atomically through <file>.tmp with mode 0600 and replaces the old file", function()
    local f = dir .. "/memory.json"
    assert.is_true(w.write_file_atomic(f, "[1]"))
    assert.equal("[1]", read(f))
    assert.equal("600", mode(f))
    assert.is_true(w.write_file_atomic(f, "[2]"))
    assert.equal("[2]", read(f))
    assert.is_nil(read(f .. ".tmp"))
  end)

  it("removes a leftover tmp first, never following it", function()
    local f = dir .. "/memory.json"
    write(f .. ".tmp", "stale")
    assert.is_true(w.write_file_atomic(f, "new"))
    assert.equal("new", read(f))
    write(dir .. "/victim", "keep")
    os.execute("ln -s '" .. dir .. "/victim' '" .. f .. ".tmp'")
    assert.is_true(w.write_file_atomic(f, "newer"))
    assert.equal("keep", read(dir .. "/victim"))
    assert.equal("newer", read(f))
  end)

  it("replaces a symlinked target by a regular file, leaving the link's target alone", function()
    local f = dir .. "/history.json"
    write(dir .. "/outside", "outside")
    os.execute("ln -s '" .. dir .. "/outside' '" .. f .. "'")
    assert.is_true(w.write_file_atomic(f, "[]"))
    assert.equal("outside", read(dir .. "/outside"))
    assert.equal("regular file", sh("stat -c %F '" .. f .. "'"))
  end)

  it("fails and keeps the previous file when a step fails", function()
    local ro = dir .. "/ro"
    local f = ro .. "/memory.json"
    os.execute("mkdir '" .. ro .. "'")
    write(f, "old")
    os.execute("chmod 500 '" .. ro .. "'")
    assert.same({ nil, "write failed" }, { w.write_file_atomic(f, "new") })
    os.execute("chmod 700 '" .. ro .. "'")
    assert.equal("old", read(f))
    assert.same({ nil, "write failed" }, { w.write_file_atomic(dir .. "/no/such/file", "x") })
    os.execute("mkdir '" .. dir .. "/isdir'")
    assert.same({ nil, "write failed" }, { w.write_file_atomic(dir .. "/isdir", "x") })
    assert.equal("directory", sh("stat -c %F '" .. dir .. "/isdir'"))
  end)

  it("moves a directory squatting on the tmp name aside and writes (hardening.md 8)", function()
    local f = dir .. "/history.json"
    write(f, "old")
    os.execute("mkdir '" .. f .. ".tmp' && touch '" .. f .. ".tmp/x'")
    assert.is_true(w.write_file_atomic(f, "new"))
    assert.equal("new", read(f))
    local names = sh("cd '" .. dir .. "' && ls -d history.json.tmp*")
    assert.matches("^history%.json%.tmp%.invalid%-%d+T%d+Z\n?$", names)
  end)

  it("move_aside renames any entry without following it and keeps the newest three", function()
    local d = dir .. "/aside"
    os.execute("mkdir -p '" .. d .. "' && echo outside > '" .. dir .. "/target'")
    os.execute("ln -s '" .. dir .. "/target' '" .. d .. "/memory.json'")
    local name = assert(w.move_aside(d .. "/memory.json"))
    assert.matches("^memory%.json%.invalid%-%d%d%d%d%d%d%d%dT%d%d%d%d%d%dZ$", name)
    assert.equal("link", w.entry_kind(d .. "/" .. name))
    assert.equal("outside\n", read(dir .. "/target"))
    assert.equal("missing", w.entry_kind(d .. "/memory.json"))
    -- the same second: a numbered name, never a replaced one
    os.execute("mkfifo '" .. d .. "/memory.json'")
    assert.equal("fifo", w.entry_kind(d .. "/memory.json"))
    local second = assert(w.move_aside(d .. "/memory.json"))
    assert.is_not.equal(name, second)
    -- older ones beyond three go, a directory with its content (no link followed)
    os.execute("mkdir -p '" .. d .. "/memory.json.invalid-19990101T000000Z/sub' && ln -s '" .. dir
      .. "/target' '" .. d .. "/memory.json.invalid-19990101T000000Z/sub/l'")
    write(d .. "/memory.json.invalid-19980101T000000Z", "older")
    write(d .. "/memory.json", "garbage")
    assert.truthy(w.move_aside(d .. "/memory.json"))
    assert.equal(3, tonumber(sh("ls '" .. d .. "' | grep -c '^memory.json.invalid-'")))
    assert.equal("missing", w.entry_kind(d .. "/memory.json.invalid-19990101T000000Z"))
    assert.equal("missing", w.entry_kind(d .. "/memory.json.invalid-19980101T000000Z"))
    assert.equal("outside\n", read(dir .. "/target"))
    assert.same({ nil, "aside failed" }, { w.move_aside(d .. "/no-such-store") })
    assert.equal("dir", w.entry_kind(d))
    assert.equal("file", w.entry_kind(dir .. "/target"))
  end)

  it("creates missing directories with mode 0700", function()
    assert.is_true(w.mkdir(dir .. "/a/b/c"))
    assert.equal("700", mode(dir .. "/a"))
    assert.equal("700", mode(dir .. "/a/b/c"))
    assert.is_true(w.mkdir(dir .. "/a/b/c"))
    assert.is_true(w.mkdir(dir .. "/a//b/"))
    write(dir .. "/file", "")
    assert.same({ nil, "mkdir failed" }, { w.mkdir(dir .. "/file") })
    assert.same({ nil, "mkdir failed" }, { w.mkdir(dir .. "/file/sub") })
  end)
end)

describe("sbxw stdin and stdout (loadable module in a child lua5.4)", function()
  local dir
  before_each(function() dir = tmpdir() end)
  after_each(function() rmdir(dir) end)

  local function lua_child(script, stdin)
    write(dir .. "/child.lua", 'package.cpath = "' .. B .. '/worker/?.so;" .. package.cpath\n'
      .. 'local w = require "sbxw"\n' .. script)
    return run(dir, "lua5.4 '" .. dir .. "/child.lua'", stdin)
  end

  it("reads all of stdin and emits the bytes once, with no newline", function()
    local out, err, code = lua_child([[
      local s = assert(w.read_stdin(16))
      assert(w.emit("<" .. s .. ">", 0))
      local ok, e = pcall(w.emit, "again", 0)
      assert(not ok and e:match("called twice"))
    ]], "0123456789abcdef")
    assert.equal("<0123456789abcdef>", out)
    assert.equal("", err)
    assert.equal(0, code)
  end)

  it("fails once stdin passes the cap", function()
    local out = lua_child([[
      local s, e = w.read_stdin(262144)
      w.emit(tostring(s) .. ":" .. tostring(e), 0)
    ]], string.rep("x", 262145))
    assert.equal("nil:too large", out)
  end)

  it("refuses statuses outside 0..125", function()
    local out = lua_child([[
      local ok = pcall(w.emit, "x", 126)
      w.emit(tostring(ok), 0)
    ]], "")
    assert.equal("false", out)
  end)
end)

describe("sbxw.broker_request against a byte-exact peer", function()
  local dir, sock, pid
  before_each(function()
    dir = tmpdir()
    sock = dir .. "/broker.sock"
  end)
  after_each(function()
    if pid then os.execute("kill " .. pid .. " 2>/dev/null") end
    pid = nil
    w.set_socket("/broker/broker.sock")
    rmdir(dir)
  end)

  -- Starts the peer answering with `response` ("-" = never answer).
  local function peer(response, slice, delay_ms)
    local resp = response
    if response ~= "-" then
      resp = dir .. "/response"
      write(resp, response)
    end
    pid = sh(string.format("%s/worker/sbxw-test-peer '%s' '%s/request' '%s' %d %d >/dev/null 2>&1 & echo $!",
      B, sock, dir, resp, slice or 0, delay_ms or 0))
    -- the peer renames its socket into place once it listens; a loaded
    -- machine may take seconds to start it
    for _ = 1, 3000 do
      if os.execute("test -S '" .. sock .. "'") then break end
      sleep(0.01)
    end
    w.set_socket(sock)
  end

  local OK = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"

  it("sends exactly the request line and the four headers of 4.1, in order", function()
    peer(OK .. "content-length: 2\r\nconnection: close\r\n\r\n{}")
    assert.same({ 200, "{}" }, { w.broker_request("/tools/clock", '{"a":1}') })
    assert.equal("POST /tools/clock HTTP/1.1\r\nhost: broker\r\ncontent-type: application/json\r\n"
      .. "content-length: 7\r\nauthorization: Bearer sandbox-dummy-key\r\n\r\n{\"a\":1}",
      read(dir .. "/request"))
  end)

  it("reads a content-length body arriving one byte at a time", function()
    peer(OK .. "Content-Length: 12\r\n\r\n{\"text\":\"x\"}", 1)
    assert.same({ 200, '{"text":"x"}' }, { w.broker_request("/model", "{}") })
  end)

  it("reads a chunked body with extensions and trailers", function()
    peer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3;x=y\r\n:1}\r\n"
      .. "0\r\nx-trailer: 1\r\n\r\n", 3)
    assert.same({ 200, '{"a":1}' }, { w.broker_request("/model", "{}") })
  end)

  it("reads until close when no framing is given, and returns any status with its body", function()
    peer("HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\n\r\nbusy")
    assert.same({ 429, "busy" }, { w.broker_request("/model", "{}") })
  end)

  it("accepts a body of exactly 1 MiB", function()
    local body = string.rep("a", 1048576)
    peer(OK .. "content-length: 1048576\r\n\r\n" .. body)
    local status, got = w.broker_request("/model", "{}")
    assert.equal(200, status)
    assert.equal(1048576, #got)
  end)

  it("aborts a body over 1 MiB in every framing", function()
    local big = string.rep("a", 1048577)
    peer(OK .. "content-length: 1048577\r\n\r\n" .. big)
    assert.same({ nil, "broker response too large" }, { w.broker_request("/model", "{}") })
    os.execute("kill " .. pid .. " 2>/dev/null; rm -f '" .. sock .. "'")
    peer(OK .. "\r\n" .. big)
    assert.same({ nil, "broker response too large" }, { w.broker_request("/model", "{}") })
    os.execute("kill " .. pid .. " 2>/dev/null; rm -f '" .. sock .. "'")
    peer(OK .. "transfer-encoding: chunked\r\n\r\n80000\r\n" .. string.rep("a", 524288) .. "\r\n80001\r\n")
    assert.same({ nil, "broker response too large" }, { w.broker_request("/model", "{}") })
    os.execute("kill " .. pid .. " 2>/dev/null; rm -f '" .. sock .. "'")
    peer(OK .. "content-length: 99999999999999999999\r\n\r\n")
    assert.same({ nil, "broker response too large" }, { w.broker_request("/model", "{}") })
  end)

  it("caps the status line and headers at 16 KiB", function()
    local function head_of(total)                        -- head bytes incl. the blank line
      local fixed = "HTTP/1.1 200 OK\r\nx-pad: \r\ncontent-length: 2\r\n\r\n"
      return "HTTP/1.1 200 OK\r\nx-pad: " .. string.rep("p", total - #fixed)
        .. "\r\ncontent-length: 2\r\n\r\n"
    end
    assert.equal(16384, #head_of(16384))
    peer(head_of(16384) .. "{}")
    assert.same({ 200, "{}" }, { w.broker_request("/model", "{}") })
    os.execute("kill " .. pid .. " 2>/dev/null; rm -f '" .. sock .. "'")
    peer(head_of(16385) .. "{}")
    assert.same({ nil, "broker response too large" }, { w.broker_request("/model", "{}") })
  end)

  it("gives a transport error for a closed, truncated or malformed answer", function()
    local cases = { "", "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345",
      "HTTP/2 200\r\n\r\n", "HTTP/1.1 2xx OK\r\n\r\n", "HTTP/1.1 100 Continue\r\n\r\n",
      "HTTP/1.1 200 OK\nx: y\n\n", "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n{}",
      "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", "HTTP/1.1 200 OK\r\n folded\r\n\r\n",
      "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n" }
    for _, resp in ipairs(cases) do
      peer(resp)
      assert.same({ nil, "transport" }, { w.broker_request("/model", "{}") }, resp)
      os.execute("kill " .. pid .. " 2>/dev/null; rm -f '" .. sock .. "'")
    end
  end)

  it("gives a transport error when nothing listens", function()
    w.set_socket(dir .. "/absent.sock")
    assert.same({ nil, "transport" }, { w.broker_request("/model", "{}") })
  end)

  it("gives a transport error at the deadline", function()
    peer("-")
    w.set_socket(sock, 300)
    local t0 = w.now()
    assert.same({ nil, "transport" }, { w.broker_request("/model", "{}") })
    local took = w.now() - t0
    assert.is_true(took >= 0.25 and took < 3, tostring(took))
  end)

  it("raises on a route that could break the request line", function()
    for _, r in ipairs({ "model", "/a b", "/x\r\nevil: 1", "/", "/\127", "/" .. string.rep("a", 1024) }) do
      assert.has_error(function() w.broker_request(r, "{}") end)
    end
  end)
end)

describe("sbxw.broker_request against a real broker (build/sbx broker)", function()
  local dir, pid
  setup(function()
    dir = tmpdir()
    write(dir .. "/conf.lua", [[
      local sandbox = require "sandbox"
      return sandbox {
        image = "pi-roundtable-sandbox:local",
        runRoot = "]] .. dir .. [[/run", workspaceRoot = "]] .. dir .. [[/work",
        stateFile = "]] .. dir .. [[/state.json",
        model = "m", modelUrl = "http://127.0.0.1:9/v1", allowHttp = true,
        apiKey = function() return "k" end,
        tools = { { name = "echo", description = "d", parameters = { type = "object", properties = {} },
          run = function(input) return "got " .. tostring(input.x) end } },
      }
    ]])
    pid = sh(string.format(B .. "/sbx broker '%s/conf.lua' --socket '%s/broker.sock' --channel c:one "
      .. "--speaker guest --quiet >/dev/null 2>&1 & echo $!", dir, dir))
    for _ = 1, 300 do
      if os.execute("test -S '" .. dir .. "/broker.sock'") then break end
      sleep(0.02)
    end
    w.set_socket(dir .. "/broker.sock")
  end)
  teardown(function()
    os.execute("kill " .. pid .. " 2>/dev/null")
    w.set_socket("/broker/broker.sock")
    sleep(0.1)
    rmdir(dir)
  end)

  it("is answered 200 through a host tool: the listener accepted our exact headers", function()
    assert.same({ 200, '{"text":"got 5"}' }, { w.broker_request("/tools/echo", '{"x":5}') })
  end)

  it("returns a refusal's status and raw body (the caller maps it to broker refused)", function()
    local status, body = w.broker_request("/tools/unknown", "{}")
    assert.equal(404, status)
    assert.is_string(body)
    assert.equal(400, (w.broker_request("/tools/echo", "[]")))
  end)
end)

describe("the static binary (worker/main.c, probe build)", function()
  local dir
  local PROBE = B .. "/worker/sbx-worker-probe"
  before_each(function() dir = tmpdir() end)
  after_each(function() rmdir(dir) end)

  it("opens only the allowed libraries and a fixed, text-only require", function()
    local out, err, code = run(dir, PROBE, "env")
    assert.equal("", err)
    assert.equal(0, code)
    local r = assert(w.json_decode(out), out)
    for _, name in ipairs({ "io", "os", "debug", "print", "warn", "loadfile", "dofile", "dump",
      "set_socket" }) do
      assert.equal("nil", r[name], name)
    end
    assert.equal("function,function,function,function,function", r.libs)
    assert.equal("function", r.collectgarbage)
    assert.equal("loaded,path,preload", r.package)
    assert.equal("spec/fixtures/sbxw_probe/?.lua", r.path)
    assert.equal("function", r.cjson)
    assert.equal("nil:attempt to load a binary chunk (mode is 't')", r.binary_load)
    assert.equal(2, r.text_load)
    assert.equal(5, r.env_load)
    assert.equal("false:module 'nope' not found", r.require_missing)
    assert.is_false(r.require_traversal)
    assert.equal("helper loaded", r.helper)
    assert.is_true(r.helper_again)
    assert.equal("nested loaded", r.nested)
  end)

  it("ignores LUA_INIT, LUA_PATH and LUA_CPATH", function()
    write(dir .. "/helper.lua", 'return { value = "hijacked" }')
    local out, err, code = run(dir, PROBE, "env",
      "LUA_INIT='error(\"init ran\")' LUA_INIT_5_4='error(1)' LUA_PATH='" .. dir
      .. "/?.lua' LUA_PATH_5_4='" .. dir .. "/?.lua' LUA_CPATH='" .. dir .. "/?.so'")
    assert.equal(0, code)
    assert.equal("", err)
    assert.equal("helper loaded", w.json_decode(out).helper)
  end)

  it("writes exactly what emit was given and exits with its status", function()
    local out, err, code = run(dir, PROBE, "echo {\"ok\":true,\"text\":\"hi\"}")
    assert.same({ '{"ok":true,"text":"hi"}', "", 0 }, { out, err, code })
    out, err, code = run(dir, PROBE, "status7")
    assert.same({ '{"ok":false,"text":"limit"}', "", 7 }, { out, err, code })
  end)

  it("fails closed on a Lua error, a missing emit, or touching io", function()
    for _, cmd in ipairs({ "error", "noemit", "stderr" }) do
      local out, err, code = run(dir, PROBE, cmd)
      assert.same({ FAILED, "", 1 }, { out, err, code }, cmd)
    end
  end)

  it("exits 1 after an emit followed by an error, keeping the one emitted reply", function()
    assert.same({ '{"ok":true,"text":"early"}', "", 1 }, { run(dir, PROBE, "late_error") })
    assert.same({ '{"ok":true,"text":"one"}', "", 1 }, { run(dir, PROBE, "twice") })
  end)

  it("turns heap exhaustion into a Lua memory error under the 256 MiB cap", function()
    assert.same({ FAILED, "", 1 }, { run(dir, PROBE, "oom") })
    local out, err, code = run(dir, PROBE, "oom_caught")
    assert.same({ '{"ok":false,"text":"not enough memory"}', "", 0 }, { out, err, code })
  end)

  it("fails closed on stdin over 256 KiB", function()
    local out = run(dir, PROBE, "echo " .. string.rep("x", 262144))
    assert.equal('{"ok":false,"text":"too large"}', out)
  end)
end)

describe("the static binary with the real worker Lua (host build)", function()
  local dir
  local HOST = B .. "/worker/sbx-worker-host"
  local have_lua = io.open("worker/lua/worker.lua", "r")
  if have_lua then have_lua:close() end
  before_each(function() dir = tmpdir() end)
  after_each(function() rmdir(dir) end)

  local turn = '{"text":"hello","speaker":{"id":"guest","name":"Guest"},"model":"fake",'
    .. '"prompt":"Use the supplied tools","timeZone":"UTC","reset":false,"tools":[],"mcp":[]}'

  local function check(name, stdin, expected)
    if not have_lua then
      pending(name .. " (worker/lua/worker.lua does not exist yet)")
      return
    end
    it(name, function()
      assert.same({ expected or FAILED, "", 1 }, { run(dir, HOST, stdin) })
    end)
  end

  -- an invalid turn is a reason of the worker's own list (operations.md 1)
  local INVALID = '{"ok":false,"text":"The sandbox worker failed.","reason":"invalid_turn"}'
  check("fails closed with no broker reachable", turn)
  check("fails closed on invalid stdin, naming its own reason", "{not json", INVALID)
  check("fails closed on stdin over 256 KiB, naming its own reason", '{"text":"' .. string.rep("x", 262144) .. '"}',
    INVALID)
end)

-- Real Docker, opt-in like spec/docker/ (SANDBOX_DOCKER_TEST=1), against the
-- image `make image` built (never built here: the spec user may not own build/).
describe("the worker image (opt-in: SANDBOX_DOCKER_TEST=1)", function()
  local IMAGE = "pi-roundtable-sandbox:local"
  if os.getenv("SANDBOX_DOCKER_TEST") ~= "1" then
    pending("set SANDBOX_DOCKER_TEST=1 to check the image")
    return
  end
  if sh("docker image inspect -f ok " .. IMAGE .. " 2>/dev/null") ~= "ok" then
    pending(IMAGE .. " is not built (make image)")
    return
  end

  local dir
  before_each(function() dir = tmpdir() end)
  after_each(function() rmdir(dir) end)

  it("is FROM scratch with USER 1000:1000, the worker as exec-form ENTRYPOINT, under 5 MB", function()
    local cfg = w.json_decode(sh("docker image inspect -f '{{json .Config}}' " .. IMAGE))
    assert.equal("1000:1000", cfg.User)
    assert.same({ "/app/worker/sbx-worker" }, { table.unpack(cfg.Entrypoint) })
    assert.is_true(cfg.Cmd == nil or cfg.Cmd == w.json_null or #cfg.Cmd == 0)
    assert.equal("", cfg.WorkingDir or "")
    assert.is_true(tonumber(sh("docker image inspect -f '{{.Size}}' " .. IMAGE)) < 5 * 1000 * 1000)
    assert.equal("1", sh("docker image inspect -f '{{len .RootFS.Layers}}' " .. IMAGE))
  end)

  it("holds only the worker, its Lua, zone files and the empty mount points", function()
    local id = sh("docker create " .. IMAGE)
    local list = sh("docker export " .. id .. " | tar -t; docker rm " .. id .. " >/dev/null")
    local top = {}
    for path in list:gmatch("[^\n]+") do
      local first = path:match("^([^/]+)")
      top[first] = true
      assert.is_nil(path:match("^bin") or path:match("^lib") or path:match("/sh$"), path)
      if first == "app" then
        assert.truthy(path == "app/" or path == "app/worker/" or path == "app/worker/sbx-worker"
          or path:match("^app/worker/lua/.*") , path)
      end
      if first == "broker" or first == "workspace" or first == "tmp" then
        assert.equal(first .. "/", path)
      end
    end
    -- what `docker create` itself adds: .dockerenv, dev, etc, proc, sys
    for name in pairs(top) do
      assert.truthy(({ app = 1, usr = 1, broker = 1, workspace = 1, tmp = 1, [".dockerenv"] = 1,
        dev = 1, etc = 1, proc = 1, sys = 1 })[name], name)
    end
    assert.truthy(list:match("usr/share/zoneinfo/UTC\n"))
    assert.truthy(list:match("usr/share/zoneinfo/Asia/Taipei\n"))
    assert.is_nil(list:match("zoneinfo/posix/"))
    assert.is_nil(list:match("zoneinfo/right/"))
    assert.truthy(list:match("app/worker/lua/worker%.lua\n"))
  end)

  it("has no shell to run", function()
    local _, _, code = run(dir, "docker run --rm --network none --entrypoint /bin/sh " .. IMAGE .. " -c true")
    assert.is_not.equal(0, code)
  end)

  it("fails closed in the container's real settings when no broker answers", function()
    os.execute("mkdir -m 700 '" .. dir .. "/run' '" .. dir .. "/work'")
    local turn = '{"text":"hello","speaker":{"id":"guest","name":"Guest"},"model":"fake",'
      .. '"prompt":"p","timeZone":"UTC","reset":false,"tools":[],"mcp":[]}'
    local cmd = "docker run --rm --interactive --log-driver none --pull never --network none "
      .. "--read-only --cap-drop ALL --security-opt no-new-privileges:true --user "
      .. sh("id -u") .. ":" .. sh("id -g") .. " --memory 512m --memory-swap 512m --pids-limit 64 "
      .. "--tmpfs /tmp:rw,noexec,nosuid,nodev,size=64m,mode=1777 "
      .. "--mount type=bind,src=" .. dir .. "/run,dst=/broker,readonly,bind-propagation=rprivate "
      .. "--mount type=bind,src=" .. dir .. "/work,dst=/workspace,bind-propagation=rprivate "
      .. "--env HOME=/tmp/home " .. IMAGE
    assert.same({ FAILED, "", 1 }, { run(dir, cmd, turn) })
  end)

  it("answers a real turn through a real broker and a fake model (bench/worker_rss.lua)", function()
    local out = sh(B .. "/sbx lua bench/worker_rss.lua " .. IMAGE .. " 2>&1")
    assert.truthy(out:find('stdout:     {"ok":true,"text":"Hello from the sealed worker."}', 1, true), out)
    assert.truthy(out:find("exit:       0", 1, true), out)
    assert.truthy(out:find("authorization Bearer bench-host-key", 1, true), out)
  end)
end)
