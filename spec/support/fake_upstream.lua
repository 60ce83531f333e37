-- fake_upstream.lua: drives spec/fixtures/fake_upstream.mjs from busted specs.
--
--   local fake = require "fake_upstream"
--   local up = fake.start()                  -- or fake.start({tls = fake.make_ca(dir)})
--   async.run(function()
--     up:reset(); up:script({{status = 401, body = "real-model-key"}})
--     local res = fake.post({url = up:url("/v1/chat/completions"), ...})
--     local log = up:log()                   -- the requests the fake received
--   end)
--   up:stop()
--
-- Control calls go through core.http_post (allow_http for plain fakes, the
-- connect_to/cainfo seams for TLS fakes), so they must run inside an async
-- task. The process is spawned with io.popen; its first stdout line gives
-- the port. It also exits by itself once this Lua process is gone.
--
-- The helper carries its own small JSON codec so that the fake's plumbing
-- does not depend on core/json.c, which the specs exercise separately.
local core = require "sandbox.core"
local async = require "sandbox.async"

local M = {}

local FIXTURE = "spec/fixtures/fake_upstream.mjs"
local TLS_HOST = "models.example"

---------------------------------------------------------------- JSON (plain)

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
                  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }

local function encode(v, out)
  local t = type(v)
  if t == "string" then
    out[#out + 1] = '"' .. v:gsub('[%c"\\]', function(c)
      return escapes[c] or string.format("\\u%04x", c:byte())
    end) .. '"'
  elseif t == "number" then
    out[#out + 1] = math.type(v) == "integer" and tostring(v) or string.format("%.17g", v)
  elseif t == "boolean" then
    out[#out + 1] = tostring(v)
  elseif t == "table" then
    if #v > 0 then
      out[#out + 1] = "["
      for i = 1, #v do
        if i > 1 then out[#out + 1] = "," end
        encode(v[i], out)
      end
      out[#out + 1] = "]"
    else
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = tostring(k) end
      table.sort(keys)
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        encode(k, out)
        out[#out + 1] = ":"
        encode(v[k], out)
      end
      out[#out + 1] = "}"
    end
  else
    error("fake_upstream: cannot encode a " .. t)
  end
end

function M.encode(v)
  local out = {}
  encode(v, out)
  return table.concat(out)
end

local function decode_at(s, i)
  i = s:find("%S", i)
  local c = s:sub(i, i)
  if c == "{" then
    local obj = {}
    i = s:find("%S", i + 1)
    if s:sub(i, i) == "}" then return obj, i + 1 end
    while true do
      local k
      k, i = decode_at(s, i)
      i = s:find("%S", i)
      assert(s:sub(i, i) == ":", "fake_upstream: bad JSON object")
      obj[k], i = decode_at(s, i + 1)
      i = s:find("%S", i)
      c = s:sub(i, i)
      if c == "}" then return obj, i + 1 end
      assert(c == ",", "fake_upstream: bad JSON object")
      i = i + 1
    end
  elseif c == "[" then
    local arr = {}
    i = s:find("%S", i + 1)
    if s:sub(i, i) == "]" then return arr, i + 1 end
    while true do
      arr[#arr + 1], i = decode_at(s, i)
      i = s:find("%S", i)
      c = s:sub(i, i)
      if c == "]" then return arr, i + 1 end
      assert(c == ",", "fake_upstream: bad JSON array")
      i = i + 1
    end
  elseif c == '"' then
    local parts, j = {}, i + 1
    while true do
      local k = s:find('["\\]', j)
      parts[#parts + 1] = s:sub(j, k - 1)
      if s:sub(k, k) == '"' then return table.concat(parts), k + 1 end
      local e = s:sub(k + 1, k + 1)
      if e == "u" then
        local cp = tonumber(s:sub(k + 2, k + 5), 16)
        j = k + 6
        if cp >= 0xD800 and cp <= 0xDBFF and s:sub(j, j + 1) == "\\u" then
          local lo = tonumber(s:sub(j + 2, j + 5), 16)
          cp = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00)
          j = j + 6
        end
        parts[#parts + 1] = utf8.char(cp)
      else
        local map = { b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }
        parts[#parts + 1] = map[e] or e
        j = k + 2
      end
    end
  elseif c == "t" then return true, i + 4
  elseif c == "f" then return false, i + 5
  elseif c == "n" then return nil, i + 4
  else
    local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", i)
    assert(num and #num > 0, "fake_upstream: bad JSON value")
    return math.tointeger(tonumber(num)) or tonumber(num), i + #num
  end
end

function M.decode(s)
  return (decode_at(s, 1))
end

---------------------------------------------------------------- requests

-- Inside a task: core.http_post(opts) and wait for its result table.
function M.post(opts)
  return async.await(function(resume)
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.on_done = resume
    local req, err = core.http_post(o)
    if not req then resume({ ok = false, error = "setup: " .. tostring(err) }) end
  end)
end

local Fake = {}
Fake.__index = Fake

-- Base URL plus path; TLS fakes answer as https://models.example:<port>.
function Fake:url(path)
  path = path or "/"
  if self.tls then return string.format("https://%s:%d%s", TLS_HOST, self.port, path) end
  return string.format("http://127.0.0.1:%d%s", self.port, path)
end

-- The trusted seams a request to a TLS fake needs (empty for plain fakes).
function Fake:seams()
  if not self.tls then return { allow_http = true } end
  return {
    cainfo = self.tls.ca,
    connect_to = { string.format("%s:%d:127.0.0.1:%d", TLS_HOST, self.port, self.port) },
  }
end

function Fake:control(path, body)
  local opts = self:seams()
  opts.url = self:url(path)
  opts.headers = { "Content-Type: application/json" }
  opts.body = body or "{}"
  opts.timeout_ms = 10000
  opts.max_body = 64 * 1024 * 1024
  local res = M.post(opts)
  if not res.ok then
    error(string.format("fake_upstream %s failed: %s %s", path, tostring(res.error), tostring(res.status)), 2)
  end
  return M.decode(res.body)
end

-- Replaces the response queue with `list` (see the fixture's header).
function Fake:script(list)
  return self:control("/__script", #list > 0 and M.encode(list) or "[]")
end

-- The recorded requests; each body is the exact bytes received.
function Fake:log()
  local entries = self:control("/__log")
  for _, e in ipairs(entries) do
    e.body = (e.body_hex:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end))
  end
  return entries
end

function Fake:reset()
  return self:control("/__reset")
end

-- Kills a fixture process (self.pid, self.pipe) and reaps it. Idempotent; no
-- task needed. Shared with the other node fixtures' helpers (stall_server).
function M.stop_process(self)
  if self.pipe then
    os.execute(string.format("kill -TERM %d 2>/dev/null", self.pid))
    self.pipe:close()
    self.pipe = nil
  end
end
Fake.stop = M.stop_process

-- A fake forgotten by a failing spec is killed when collected (before its
-- pipe, whose close would otherwise wait for the process forever).
Fake.__gc = Fake.stop

-- Starts a node fixture with `--parent <our pid>` (and `--tls CERT KEY` when
-- opts.tls, `--tls-max V` when opts.tls_max too) and returns its stdout pipe and first line (a JSON object with
-- at least "pid"). env -u LD_PRELOAD: a sanitizer run preloads libasan for
-- the core; the fixture is not under test and must not inherit it.
function M.spawn(fixture, opts, who)
  local cmd = string.format("exec env -u LD_PRELOAD node %s --parent %d", fixture, core.getpid())
  if opts and opts.args then cmd = cmd .. " " .. opts.args end
  if opts and opts.tls then
    cmd = cmd .. string.format(" --tls '%s' '%s'", opts.tls.cert, opts.tls.key)
    if opts.tls_max then cmd = cmd .. " --tls-max " .. opts.tls_max end
  end
  local pipe = assert(io.popen(cmd, "r"))
  local line = pipe:read("l")
  if not line then
    pipe:close()
    error(who .. ": the node process printed nothing (see its stderr)", 3)
  end
  return pipe, line
end

-- fake.start({tls = {cert=, key=, ca=}}) -> fake
function M.start(opts)
  opts = opts or {}
  local pipe, line = M.spawn(FIXTURE, opts, "fake_upstream")
  local port = tonumber(line:match('"port":(%d+)'))
  local pid = tonumber(line:match('"pid":(%d+)'))
  assert(port and pid, "fake_upstream: unexpected first line")
  return setmetatable({ port = port, pid = pid, pipe = pipe, tls = opts.tls }, Fake)
end

-- A provider family's loopback server (spec/fixtures/provider_upstream.mjs):
-- the same control calls (log, reset, url) as the fake.
function M.start_provider(family, key)
  local pipe, line = M.spawn("spec/fixtures/provider_upstream.mjs",
    { args = string.format("--family %s --key '%s'", family, key or "") }, "provider_upstream")
  local port = tonumber(line:match('"port":(%d+)'))
  local pid = tonumber(line:match('"pid":(%d+)'))
  assert(port and pid, "provider_upstream: unexpected first line")
  return setmetatable({ port = port, pid = pid, pipe = pipe, family = family }, Fake)
end

-- A loopback port nothing listens on: bound by a server, then closed.
function M.closed_port()
  local s = assert(core.http_server { on_request = function(req) req:reply(200, "") end })
  local port = s:port()
  s:close()
  return port
end

-- fake.make_ca(dir) -> {cert=, key=, ca=}: a self-signed certificate for
-- models.example (CA:TRUE, so it is also the trust anchor the specs pass
-- as cainfo). dir must exist.
function M.make_ca(dir)
  local cert, key = dir .. "/cert.pem", dir .. "/key.pem"
  local cmd = string.format(
    "env -u LD_PRELOAD openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes " ..
    "-keyout '%s' -out '%s' -days 2 -subj '/CN=%s' " ..
    "-addext 'subjectAltName=DNS:%s' -addext 'basicConstraints=critical,CA:TRUE' " ..
    ">/dev/null 2>&1", key, cert, TLS_HOST, TLS_HOST)
  local ok = os.execute(cmd)
  assert(ok, "fake_upstream: openssl could not make the certificate")
  return { cert = cert, key = key, ca = cert }
end

return M
