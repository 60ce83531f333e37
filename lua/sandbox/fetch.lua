-- fetch.lua: safe fetch, the host-side SSRF-safe HTTP client for URLs a
-- guest or a model chose (shared/spec/fetch-and-delegation.md section 1).
--
--   fetch.safe_fetch(url, opts)          yields; result table or raises
--   fetch.assert_public_url(url, opts)   yields; canonical URL string or raises
--   fetch.is_public_address(text)        pure
--   fetch.pinned_transport(url, address, signal, maxBytes, headers)
--                                        yields; one attempt against one vetted address
--   fetch.is_unsafe_url_error(err)
--
-- The hop loop lives here; the C core does the rest: core.url_admit and
-- core.addr_classify (netaddr.c) admit URLs and judge addresses,
-- core.fetch_resolve runs getaddrinfo on the libuv thread pool, and
-- core.fetch_attempt (safefetch.c) makes one pinned GET with every byte
-- bound enforced as it arrives. Every hop: admit, one lookup, refuse the hop
-- unless every answer is public and not the host's own, then try the vetted
-- addresses one at a time in resolver order, each attempt pinned to its
-- address; redirects are admitted and vetted again from scratch.
--
-- opts.resolve, opts.transport and opts.localAddresses are trusted test
-- seams: never build them (or headers, or bounds) from guest data.
local async = require "sandbox.async"
local core = require "sandbox.core"
local signals = require "sandbox.signal"

local M = {}

M.DEFAULT_MAX_BYTES = 5242880
M.DEFAULT_TIMEOUT_MS = 60000
M.DEFAULT_IDLE_TIMEOUT_MS = 30000
M.DEFAULT_MAX_REDIRECTS = 5
M.DEFAULT_CHECK_TIMEOUT_MS = 10000
M.CONNECT_TIMEOUT_MS = 3000

local BOUNDS = {
  maxBytes = { 1, 33554432 },
  timeoutMs = { 1, 120000 },
  idleTimeoutMs = { 1, 120000 },
  maxRedirects = { 0, 10 },
}
local DEFAULT_ACCEPT = "text/html,application/pdf,text/plain,application/json;q=0.9,*/*;q=0.1"
local USER_AGENT = "pi-roundtable-sandbox"
local MAX_HEADERS, MAX_NAME, MAX_VALUE = 32, 256, 8192
local FORBIDDEN_HEADERS = {
  host = true, connection = true, ["content-length"] = true, ["transfer-encoding"] = true,
  te = true, trailer = true, upgrade = true, ["keep-alive"] = true, expect = true,
}
local REDIRECT = { [301] = true, [302] = true, [303] = true, [307] = true, [308] = true }
local FALLBACK = {
  ECONNREFUSED = true, ECONNRESET = true, EHOSTUNREACH = true, ENETUNREACH = true,
  EAFNOSUPPORT = true, EADDRNOTAVAIL = true, ETIMEDOUT = true,
}

---------------------------------------------------------------- errors (1.15)

local Error = {}
Error.__index = Error
Error.__tostring = function(e) return e.message end

local function new_error(name, message, extra)
  local e = { name = name, message = message }
  if extra then for k, v in pairs(extra) do e[k] = v end end
  return setmetatable(e, Error)
end

local function raise(name, message, extra) error(new_error(name, message, extra), 0) end
local function unsafe(message, extra) raise("UnsafeUrlError", message, extra) end

M.new_error = new_error

function M.is_unsafe_url_error(err)
  return type(err) == "table" and getmetatable(err) == Error and
    (err.name == "UnsafeUrlError" or err.name == "ResponseTooLargeError")
end

---------------------------------------------------------------- netaddr glue

-- core.url_admit(raw) / core.url_resolve_ref(base_href, location)
-- (netaddr.c): an admitted URL table or nil and the catalogue message.
local function admit(raw, base)
  local u, msg
  if base then u, msg = core.url_resolve_ref(base.href, raw) else u, msg = core.url_admit(raw) end
  if u == nil then return nil, msg end
  return {
    href = u.href,
    host = u.host,                 -- without brackets
    kind = u.host_kind,            -- "name" | "ipv4" | "ipv6"
    port = u.port,                 -- effective
    https = u.https,
    origin = u.origin,             -- scheme://authority, canonical
  }
end

-- A strict literal of its declared family, public, and (when locals is
-- given) not one of the host's own addresses.
local function is_public(text, family, locals)
  local _, fam = core.addr_parse(text)
  if fam == nil or (family ~= nil and fam ~= family) then return false end
  return core.addr_classify(text, nil, locals) == "public"
end

function M.is_public_address(text)
  if type(text) ~= "string" then return false end
  return is_public(text)
end

---------------------------------------------------------------- options

local function integral(v, lo, hi)
  if math.type(v) == "float" then
    if v ~= v or v ~= math.floor(v) or v == math.huge or v == -math.huge then return nil end
    v = math.tointeger(v)
    if v == nil then return nil end
  elseif math.type(v) ~= "integer" then
    return nil
  end
  if v < lo or v > hi then return nil end
  return v
end

local function bound(opts, name, default)
  local v = opts[name]
  if v == nil then return default end
  local r = BOUNDS[name]
  v = integral(v, r[1], r[2])
  if v == nil then unsafe("Invalid fetch bounds") end
  return v
end

local function is_token(s)
  return #s > 0 and s:find("^[!#$%%&'*+%-.^_`|~%w]+$") ~= nil
end

-- The caller's trusted headers (1.9) as an ordered list of {lower, value}.
local function check_headers(h)
  if h == nil then return {} end
  if type(h) ~= "table" then unsafe("Invalid fetch headers") end
  local list, seen, n = {}, {}, 0
  for name, value in pairs(h) do
    n = n + 1
    if n > MAX_HEADERS or type(name) ~= "string" or #name > MAX_NAME or not is_token(name) or
      type(value) ~= "string" or #value > MAX_VALUE or value:find("[%z\1-\8\10-\31\127]") then
      unsafe("Invalid fetch headers")
    end
    local lower = name:lower()
    if seen[lower] or FORBIDDEN_HEADERS[lower] or lower:sub(1, 6) == "proxy-" then
      unsafe("Invalid fetch headers")
    end
    seen[lower] = true
    list[#list + 1] = { lower, value }
  end
  table.sort(list, function(a, b) return a[1] < b[1] end)
  return list
end

-- Request headers for one hop: defaults, the caller's (replacing defaults),
-- then the forced two. Returns lines for curl and a name -> value map.
local function build_headers(caller)
  local order, map = { "accept", "user-agent" }, { accept = DEFAULT_ACCEPT, ["user-agent"] = USER_AGENT }
  for _, kv in ipairs(caller) do
    local name = kv[1]
    if name ~= "accept-encoding" then       -- forced below; the caller's never takes effect
      if map[name] == nil then order[#order + 1] = name end
      map[name] = kv[2]
    end
  end
  map["accept-encoding"] = "identity"
  map["connection"] = "close"
  order[#order + 1] = "accept-encoding"
  order[#order + 1] = "connection"
  local lines = {}
  for i, name in ipairs(order) do lines[i] = name .. ": " .. map[name] end
  return lines, map
end

---------------------------------------------------------------- waiting

-- Runs start(resume) (which returns a cancel function or nil) and yields
-- until resume(...) is called, the deadline passes or the signal aborts.
-- Returns "done", ... | "timeout" | "abort"; on timeout or abort the work
-- is cancelled.
local function wait(start, deadline, signal)
  local cancel, timer, unhook
  local out = table.pack(async.await(function(resume)
    local left = deadline - core.now()
    if left <= 0 then resume("timeout") return end
    if signal then
      if signal.aborted then resume("abort") return end
      unhook = signal:on_abort(function() resume("abort") end)
    end
    timer = core.timer(left, function() resume("timeout") end)
    local ok, c = pcall(start, function(...) resume("done", ...) end)
    if not ok then
      timer:stop()
      if unhook then unhook() end
      error(c, 0)
    end
    cancel = c
  end))
  if timer then timer:stop() end
  if unhook then unhook() end
  if out[1] ~= "done" and type(cancel) == "function" then cancel() end
  return table.unpack(out, 1, out.n)
end

-- Runs a (possibly yielding) seam as its own task; resume gets ok, results.
local function seam_start(fn, ...)
  local args = table.pack(...)
  return function(resume)
    local task = async.spawn(function() return fn(table.unpack(args, 1, args.n)) end)
    async.on_done(task, function(t) resume(table.unpack(t.results, 1, t.results.n)) end)
    return nil
  end
end

local function check_signal(signal)
  if signal then signal:throw_if_aborted() end
end

---------------------------------------------------------------- vetting (1.7)

local function local_list(opts, deadline, signal, timeout_msg)
  local list
  if opts.localAddresses then
    local how, ok, res = wait(seam_start(opts.localAddresses), deadline, signal)
    if how == "timeout" then raise("TimeoutError", timeout_msg) end
    if how == "abort" then check_signal(signal) end
    if not ok then error(res, 0) end
    list = res
  else
    list = core.local_addresses()
  end
  if type(list) ~= "table" then return nil end
  for _, text in ipairs(list) do
    if type(text) ~= "string" or core.addr_parse(text) == nil then return nil end
  end
  return list
end

-- One lookup for the hop, every answer vetted. Returns the vetted list of
-- { address = text, family = 4 | 6 } in resolver order.
local function vet(u, opts, deadline, signal, timeout_msg)
  local answers
  if u.kind == "ipv4" or u.kind == "ipv6" then
    answers = { { address = u.host, family = u.kind == "ipv4" and 4 or 6 } }
  elseif opts.resolve then
    local how, ok, res = wait(seam_start(opts.resolve, u.host), deadline, signal)
    if how == "timeout" then raise("TimeoutError", timeout_msg) end
    if how == "abort" then check_signal(signal) end
    if not ok then
      raise("ResolveError", type(res) == "table" and tostring(res.message or res) or tostring(res))
    end
    answers = res
  else
    local how, list, msg = wait(function(resume)
      local lk, err = core.fetch_resolve(u.host, resume)
      if lk == nil then resume(nil, err) return nil end
      return function() lk:cancel() end
    end, deadline, signal)
    if how == "timeout" then raise("TimeoutError", timeout_msg) end
    if how == "abort" then check_signal(signal) end
    if list == nil then raise("ResolveError", tostring(msg)) end
    answers = list
  end
  if type(answers) ~= "table" or #answers == 0 then unsafe("URL resolves to a non-public address") end
  local locals = local_list(opts, deadline, signal, timeout_msg)
  if locals == nil then unsafe("URL resolves to a non-public address") end
  local vetted = {}
  for i, a in ipairs(answers) do
    local text, fam = type(a) == "table" and a.address, type(a) == "table" and a.family
    if type(text) ~= "string" or (fam ~= 4 and fam ~= 6) or not is_public(text, fam, locals) then
      unsafe("URL resolves to a non-public address")
    end
    vetted[i] = { address = text, family = fam }
  end
  return vetted
end

---------------------------------------------------------------- one attempt (1.8)

local KIND_ERRORS = {
  idle = { "UnsafeUrlError", "Response idle timeout exceeded" },
  header_block = { "UnsafeUrlError", "Response header block too large" },
  encoding = { "UnsafeUrlError", "Response exceeds bounds or uses unsupported encoding" },
  wire_too_large = { "UnsafeUrlError", "Wire body too large" },
  body_too_large = { "UnsafeUrlError", "Response body too large" },
  decode = { "DecodeError", "Response body could not be decoded" },
  pin = { "TransportError", "Connection did not reach the pinned address" },
  bad_status = { "TransportError", "Invalid HTTP response" },
  nomem = { "TransportError", "out of memory" },
}

local function attempt_error(res)
  if res.kind == "declared_too_large" then
    return new_error("ResponseTooLargeError", "Response exceeds bounds",
      { status = res.status, headers = res.headers or {} })
  elseif res.kind == "connect_timeout" then
    return new_error("TransportError", "Connection deadline exceeded", { code = "ETIMEDOUT" })
  elseif res.kind == "transport" then
    return new_error("TransportError", res.message or "transport failure",
      { code = res.code, afterResponse = not res.fallback or nil })
  end
  local e = KIND_ERRORS[res.kind] or { "TransportError", "transport failure" }
  return new_error(e[1], e[2])
end

-- start function for wait(): one pinned attempt. address is a vetted
-- { address, family [, port] } (port: a trusted seam's loopback override).
local function attempt_start(u, address, max_bytes, lines, limits)
  return function(resume)
    local left = math.max(1, math.min(limits.deadline - core.now(), BOUNDS.timeoutMs[2]))
    local req, err = core.fetch_attempt {
      url = u.href,
      address = address.address,
      family = address.family,
      port = address.port or u.port,
      headers = lines,
      max_bytes = max_bytes,
      timeout_ms = left,
      connect_timeout_ms = math.min(M.CONNECT_TIMEOUT_MS, left),
      idle_timeout_ms = limits.idle,
      cainfo = limits.cainfo,
      on_done = resume,
    }
    if req == nil then
      resume({ ok = false, kind = "transport", message = err })
      return nil
    end
    return function() req:cancel() end
  end
end

local function to_result(u, res)
  return {
    url = u.href,
    location_count = res.location_count,
    status = res.status,
    statusText = res.status_text,
    headers = res.headers or {},
    data = res.body or "",
  }
end

local function parse_for_transport(url)
  local u, msg = admit(url)
  if u == nil then unsafe(msg) end
  return u
end

-- The default transport, public for specs and for seams that map a vetted
-- address to a loopback server. Vets nothing: address must come from vetting.
function M.pinned_transport(url, address, signal, maxBytes, headers, limits)
  local u = type(url) == "table" and url or parse_for_transport(url)
  if type(address) == "string" then
    address = { address = address, family = address:find(":", 1, true) and 6 or 4 }
  end
  limits = limits or {}
  local deadline = limits.deadline or (core.now() + M.DEFAULT_TIMEOUT_MS)
  local lines = {}
  for name, value in pairs(headers or {}) do lines[#lines + 1] = name .. ": " .. value end
  table.sort(lines)
  local how, res = wait(attempt_start(u, address, maxBytes or M.DEFAULT_MAX_BYTES, lines, {
    deadline = deadline, idle = limits.idleTimeoutMs or M.DEFAULT_IDLE_TIMEOUT_MS,
    cainfo = limits.cainfo,
  }), deadline, signal)
  if how == "timeout" then raise("TimeoutError", "Fetch deadline exceeded") end
  if how == "abort" then check_signal(signal) end
  if not res.ok then error(attempt_error(res), 0) end
  return to_result(u, res)
end

---------------------------------------------------------------- safe_fetch (1.10, 1.11)

local function try_addresses(u, vetted, opts, ctx, header_map, lines)
  for _, address in ipairs(vetted) do
    check_signal(ctx.signal)
    local res, err
    if opts.transport then
      local how, ok, r = wait(seam_start(opts.transport, u.href, address, ctx.seam_signal, ctx.max_bytes,
        header_map), ctx.deadline, ctx.signal)
      if how == "timeout" then
        ctx.seam_signal:abort("Fetch deadline exceeded")
        raise("TimeoutError", "Fetch deadline exceeded")
      end
      if how == "abort" then check_signal(ctx.signal) end
      if ok then res = r else err = r end
      if ok and type(res) ~= "table" then err = new_error("TransportError", "transport returned no result") end
    else
      local how, r = wait(attempt_start(u, address, ctx.max_bytes, lines, ctx), ctx.deadline, ctx.signal)
      if how == "timeout" then raise("TimeoutError", "Fetch deadline exceeded") end
      if how == "abort" then check_signal(ctx.signal) end
      if r.ok then res = to_result(u, r) else err = attempt_error(r) end
    end
    if res and not err then return res end
    if not (type(err) == "table" and FALLBACK[err.code] and not err.afterResponse) then
      error(err, 0)
    end
  end
  unsafe("No vetted address could be reached")
end

local function check_bounds(opts)
  if opts ~= nil and type(opts) ~= "table" then unsafe("Invalid fetch bounds") end
  opts = opts or {}
  local b = {
    max_bytes = bound(opts, "maxBytes", M.DEFAULT_MAX_BYTES),
    timeout = bound(opts, "timeoutMs", M.DEFAULT_TIMEOUT_MS),
    idle = bound(opts, "idleTimeoutMs", M.DEFAULT_IDLE_TIMEOUT_MS),
    max_redirects = bound(opts, "maxRedirects", M.DEFAULT_MAX_REDIRECTS),
  }
  if opts.followRedirects ~= nil and type(opts.followRedirects) ~= "boolean" then
    unsafe("Invalid fetch bounds")
  end
  b.follow = opts.followRedirects ~= false
  return opts, b
end

local hop_loop

function M.safe_fetch(url, opts)
  local start = core.now()
  local b
  opts, b = check_bounds(opts)
  local caller = check_headers(opts.headers)
  local ctx = {
    deadline = start + b.timeout, idle = b.idle, max_bytes = b.max_bytes,
    signal = opts.signal, cainfo = opts.cainfo,
  }
  if opts.transport then
    -- what a transport seam sees: the caller's signal, plus our own abort
    -- when the call's deadline gives up on the seam
    ctx.seam_signal = signals.child(opts.signal)
    local ok, res = pcall(hop_loop, url, opts, b, caller, ctx)
    ctx.seam_signal:detach()
    if not ok then error(res, 0) end
    return res
  end
  return hop_loop(url, opts, b, caller, ctx)
end

hop_loop = function(url, opts, b, caller, ctx)
  if type(url) ~= "string" then unsafe("Invalid URL") end
  local u, msg = admit(url)
  if u == nil then unsafe(msg) end
  local first_origin, dropped, any_https = u.origin, false, u.https
  local hop = 0
  while true do
    check_signal(ctx.signal)
    local vetted = vet(u, opts, ctx.deadline, ctx.signal, "Fetch deadline exceeded")
    local lines, map = build_headers(dropped and {} or caller)
    local res = try_addresses(u, vetted, opts, ctx, map, lines)
    if type(res.data) ~= "string" then res.data = "" end
    if #res.data > b.max_bytes then unsafe("Response body too large") end
    if not b.follow or not REDIRECT[res.status] then return res end
    if hop >= b.max_redirects then unsafe("Too many redirects") end
    local loc = res.headers and res.headers.location
    if loc == nil or loc == "" then unsafe("Redirect without location") end
    if type(loc) ~= "string" or res.location_count and res.location_count > 1 then
      unsafe("Invalid redirect location")
    end
    local nu, lmsg = admit(loc, u)
    if nu == nil then unsafe(lmsg) end
    if any_https and not nu.https then unsafe("Redirect from HTTPS to HTTP refused") end
    any_https = any_https or nu.https
    if nu.origin ~= first_origin then dropped = true end
    u = nu
    hop = hop + 1
  end
end

---------------------------------------------------------------- assert_public_url (1.14)

function M.assert_public_url(url, opts)
  local start = core.now()
  if opts ~= nil and type(opts) ~= "table" then unsafe("Invalid fetch bounds") end
  opts = opts or {}
  local timeout = M.DEFAULT_CHECK_TIMEOUT_MS
  if opts.timeoutMs ~= nil then
    timeout = integral(opts.timeoutMs, 1, BOUNDS.timeoutMs[2])
    if timeout == nil then unsafe("Invalid fetch bounds") end
  end
  check_signal(opts.signal)
  if type(url) ~= "string" then unsafe("Invalid URL") end
  local u, msg = admit(url)
  if u == nil then unsafe(msg) end
  if core.now() - start >= timeout then raise("TimeoutError", "URL check deadline exceeded") end
  vet(u, opts, start + timeout, opts.signal, "URL check deadline exceeded")
  return u.href
end

return M
