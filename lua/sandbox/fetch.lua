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
-- The thin Lua layer of spec 1.1. The hop loop is C (core/fetch_call.c,
-- the sbx_fetch.h API): admission, one lookup per hop, vetting against the
-- host's interfaces, pinned attempts with fallback, redirects, bounds,
-- deadlines and the error catalogue. Here: the coroutine-facing wait on the
-- C call (yield until it is done; a caller signal cancels it and raises the
-- signal's reason), conversion of results and error codes to Lua tables,
-- and trampolines that bind the resolve / transport / localAddresses seams
-- to the C seams (each seam call runs as its own task).
--
-- opts.resolve, opts.transport and opts.localAddresses are trusted test
-- seams: never build them (or headers, or bounds) from guest data. So is
-- opts.testConnectTo = { address = ip, port = n }: the default (C) transport
-- then connects every vetted attempt there (specs and benchmarks reach a
-- loopback server through the real transport; vetting is unchanged).
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

local MAX_TIMEOUT_MS = 120000

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

local E_DECLARED = -2011

-- The C call's error description (core/fetch_lua.c) as the 1.15 object.
local function to_error(d)
  if d.name == "ResponseTooLargeError" or d.code == E_DECLARED then
    return new_error(d.name, d.message, { status = d.status, headers = d.headers or {} })
  elseif d.name == "TransportError" and (d.errno or d.afterResponse) then
    return new_error(d.name, d.message, { code = d.errno, afterResponse = d.afterResponse })
  end
  return new_error(d.name, d.message)
end

---------------------------------------------------------------- netaddr glue

-- core.url_admit(raw) (netaddr.c): an admitted URL table or nil and the
-- catalogue message. Only pinned_transport parses here; the hop loop is C.
local function admit(raw)
  local u, msg = core.url_admit(raw)
  if u == nil then return nil, msg end
  return { href = u.href, port = u.port }
end

function M.is_public_address(text)
  if type(text) ~= "string" then return false end
  if core.addr_parse(text) == nil then return false end
  return core.addr_classify(text) == "public"
end

---------------------------------------------------------------- waiting

-- Runs start(resume) (which returns a cancel function or nil) and yields
-- until resume(...) is called, the deadline passes or the signal aborts.
-- Returns "done", ... | "timeout" | "abort"; on timeout or abort the work
-- is cancelled. (pinned_transport only: the C call keeps its own deadline.)
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

local function check_signal(signal)
  if signal then signal:throw_if_aborted() end
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
    local left = math.max(1, math.min(limits.deadline - core.now(), MAX_TIMEOUT_MS))
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

---------------------------------------------------------------- seam trampolines

-- Each binds a host seam (a Lua function that may yield) to a C seam: the
-- C call hands over a reply; the seam runs as its own task and its outcome
-- answers the reply. st keeps what must reach the caller unchanged: the
-- transport's result table and a seam's raised error object.

local function resolve_trampoline(fn)
  return function(reply, host)
    local task = async.spawn(fn, host)
    async.on_done(task, function(t)
      local ok, res = t.results[1], t.results[2]
      if ok then
        reply:answers(res)
      else
        reply:fail(nil, false, type(res) == "table" and tostring(res.message or res) or tostring(res))
      end
    end)
  end
end

local function local_trampoline(fn, st)
  return function(reply)
    local task = async.spawn(fn)
    async.on_done(task, function(t)
      local ok, res = t.results[1], t.results[2]
      if ok then
        reply:locals(res)
      else
        st.seam_error = res
        reply:fail(nil, false, tostring(res))
      end
    end)
  end
end

local function transport_trampoline(fn, st)
  return function(reply, url, address, max_bytes, headers)
    local task = async.spawn(fn, url, address, st.seam_signal, max_bytes, headers)
    async.on_done(task, function(t)
      local ok, res = t.results[1], t.results[2]
      if ok and type(res) == "table" then
        if type(res.data) ~= "string" then res.data = "" end
        st.result = res
        reply:result(res, url)
        return
      end
      local err = res
      if ok then err = new_error("TransportError", "transport returned no result") end
      st.seam_error = err
      local code = type(err) == "table" and type(err.code) == "string" and err.code or nil
      local after = type(err) == "table" and err.afterResponse and true or false
      reply:fail(code, after, type(err) == "table" and tostring(err.message or "transport failure")
        or tostring(err))
    end)
  end
end

-- Yields until the C call is done. A caller signal cancels it and raises
-- the signal's reason. Returns the result table or raises the 1.15 object.
local function run_call(start_fn, url, copts, signal, st)
  local call
  local how, res, err = async.await(function(resume)
    local c, refusal = start_fn(url, copts, function(r, e) resume("done", r, e) end)
    if c == nil then resume("refused", nil, refusal) return end
    call = c
    if signal then
      st.unhook = signal:on_abort(function()
        call:cancel()
        resume("abort")
      end)
    end
  end)
  if st.unhook then st.unhook() end
  if how == "abort" then check_signal(signal) end
  if res ~= nil then
    if res.seam_token then return st.result end
    return res
  end
  if err.from_seam and st.seam_error ~= nil then error(st.seam_error, 0) end
  error(to_error(err), 0)
end

-- The options the C call reads (core/fetch_lua.c converts, C judges).
local function c_opts(opts, st, with_transport)
  local o = {
    maxBytes = opts.maxBytes, timeoutMs = opts.timeoutMs, idleTimeoutMs = opts.idleTimeoutMs,
    maxRedirects = opts.maxRedirects, followRedirects = opts.followRedirects,
    headers = opts.headers, cainfo = opts.cainfo, testConnectTo = opts.testConnectTo,
  }
  if opts.resolve then o.resolve = resolve_trampoline(opts.resolve) end
  if opts.localAddresses then o.localAddresses = local_trampoline(opts.localAddresses, st) end
  if with_transport and opts.transport then o.transport = transport_trampoline(opts.transport, st) end
  return o
end

---------------------------------------------------------------- safe_fetch (1.10, 1.11)

function M.safe_fetch(url, opts)
  if opts ~= nil and type(opts) ~= "table" then unsafe("Invalid fetch bounds") end
  opts = opts or {}
  local st = {}
  local signal = opts.signal
  local copts = c_opts(opts, st, true)
  if signal and signal.aborted then
    -- bounds, headers and the URL are judged first, then the signal
    local refusal = core.fetch_opts_check(copts, false)
    if refusal then error(to_error(refusal), 0) end
    if type(url) ~= "string" then unsafe("Invalid URL") end
    local _, msg = core.url_admit(url)
    if msg then unsafe(msg) end
    check_signal(signal)
  end
  if opts.transport then
    -- what a transport seam sees: the caller's signal, plus our own abort
    -- when the call's deadline gives up on the seam
    st.seam_signal = signals.child(signal)
  end
  local ok, res = pcall(run_call, core.fetch_start, url, copts, signal, st)
  if st.seam_signal then
    if not ok and getmetatable(res) == Error and res.name == "TimeoutError" then
      st.seam_signal:abort("Fetch deadline exceeded")
    end
    st.seam_signal:detach()
  end
  if not ok then error(res, 0) end
  return res
end

---------------------------------------------------------------- assert_public_url (1.14)

function M.assert_public_url(url, opts)
  if opts ~= nil and type(opts) ~= "table" then unsafe("Invalid fetch bounds") end
  opts = opts or {}
  local st = {}
  local copts = { checkTimeoutMs = opts.timeoutMs }
  if opts.resolve then copts.resolve = resolve_trampoline(opts.resolve) end
  if opts.localAddresses then copts.localAddresses = local_trampoline(opts.localAddresses, st) end
  local signal = opts.signal
  if signal and signal.aborted then
    -- the bounds are judged first, then the signal, then the URL
    local refusal = core.fetch_opts_check(copts, true)
    if refusal then error(to_error(refusal), 0) end
    check_signal(signal)
  end
  local res = run_call(core.assert_url_start, url, copts, signal, st)
  return res.url
end

return M
