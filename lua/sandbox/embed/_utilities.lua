-- embed/_utilities.lua: the host facilities of the embedding ABI that need
-- no app (shared/spec/fetch-and-delegation.md sections 1 and 3, reached from
-- the Bun bridge as safeFetch, assertPublicUrl, pinnedTransport and
-- ScopedSandboxDelegator). embed.lua registers these request handlers; they
-- run on an engine made with or without a config script.
--
-- Requests (core/sbx_ffi.h lists them with the others):
--   {"type":"fetch","url":U,"options":{...},"owner":O,"seams":{"resolve":true,...}}
--   {"type":"assertPublicUrl","url":U,"options":{...},"owner":O,"seams":{...}}
--   {"type":"pinnedTransport","url":U,"address":{"address":A,"family":4|6,"port":P?},
--    "maxBytes":N,"headers":{...}}
--   {"type":"isPublicAddress","text":T}
--   {"type":"scrubDiagnostic","text":T,"max":N|"Infinity"}
--   {"type":"delegator.new","owner":O,"options":{...},"callbacks":{"run":true,...}}
--   {"type":"delegator.start","owner":O,"request":{...},"keys":[...]}
--   {"type":"delegator.runningChannels"|"delegator.idle"|"delegator.dispose","owner":O}
--   {"type":"research.check"|"research.run",...}   (embed_research.lua)
--   {"type":"precheck.new"|"precheck.describe"|"precheck.run"|...}  (embed/_precheck.lua)
--
-- Bytes cross JSON as base64 ("dataBase64"). A seam or callback named in
-- "seams"/"callbacks" becomes a host call (embed.lua Engine:host_call) to
-- the function the host registered under "owner". Non-finite numbers travel
-- as the strings "Infinity", "-Infinity" and "NaN" (JSON has none).
-- Numeric options are passed through unconverted otherwise, so the Lua
-- modules' own checks (and error strings) decide.
local core = require "sandbox.core"
local delegator = require "sandbox.delegator"
local errors = require "sandbox.errors"
local fetch = require "sandbox.fetch"
local scrub = require "sandbox.delegator.scrub"
local signals = require "sandbox.signal"

local M = {}

local NON_FINITE = { Infinity = math.huge, ["-Infinity"] = -math.huge, NaN = 0 / 0 }

local function number_or_raw(v)
  if type(v) == "string" and NON_FINITE[v] ~= nil then return NON_FINITE[v] end
  return v
end

local function need_owner(req)
  if type(req.owner) ~= "string" or req.owner == "" or #req.owner > 128 then
    error(errors.EMBED_REQUEST .. "owner must be a non-empty string", 0)
  end
  return req.owner
end

-- The request's own cancellation signal ({"type":"cancel","target":R}).
local function request_signal(self, rid)
  local sig = signals.new()
  self.signals[rid] = sig
  return sig
end

-- Wraps a request handler: fn(self, rid, req, fin) gets `fin`, a signal
-- aborted when the handler returns or raises; host calls made for the
-- request pass it as their scope, so they are abandoned with it.
local function finishing(fn)
  return function(self, rid, req)
    local fin = signals.new()
    local ok, res = pcall(fn, self, rid, req, fin)
    fin:abort("request finished")
    if not ok then error(res, 0) end
    return res
  end
end

---------------------------------------------------------------- safe fetch

local FETCH_OPTIONS = { "maxBytes", "timeoutMs", "idleTimeoutMs", "maxRedirects", "followRedirects", "headers" }

local function result_json(res)
  return {
    url = res.url,
    status = res.status,
    statusText = res.statusText,
    headers = res.headers or {},
    dataBase64 = core.base64(type(res.data) == "string" and res.data or ""),
  }
end

-- What a host transport seam answered -> the result table safe_fetch expects.
local function seam_result(r)
  if type(r) ~= "table" then return r end
  local data = ""
  if r.dataBase64 ~= nil then
    data = type(r.dataBase64) == "string" and core.base64_decode(r.dataBase64) or nil
    if data == nil then error(fetch.new_error("TransportError", "transport returned invalid data"), 0) end
  end
  return { url = r.url, status = r.status, statusText = r.statusText, headers = r.headers or {}, data = data }
end

local function fetch_options(self, rid, req, names, fin)
  local o = req.options
  if o ~= nil and type(o) ~= "table" then error(fetch.new_error("UnsafeUrlError", "Invalid fetch bounds"), 0) end
  local opts = {}
  for _, k in ipairs(names) do
    if o and o[k] ~= nil then opts[k] = number_or_raw(o[k]) end
  end
  opts.signal = request_signal(self, rid)
  local seams = type(req.seams) == "table" and req.seams or {}
  if seams.resolve or seams.localAddresses or seams.transport then
    local owner = need_owner(req)
    if seams.resolve then
      opts.resolve = function(hostname) return self:host_call(owner, "resolve", { hostname }, nil, fin) end
    end
    if seams.localAddresses then
      opts.localAddresses = function() return self:host_call(owner, "localAddresses", {}, nil, fin) end
    end
    if seams.transport then
      opts.transport = function(url, address, signal, max_bytes, headers)
        return seam_result(self:host_call(owner, "transport", { url, address, max_bytes, headers }, signal, fin))
      end
    end
  end
  return opts
end

local function register_fetch(H, U)
  H.fetch = finishing(function(self, rid, req, fin)
    local opts = fetch_options(self, rid, req, FETCH_OPTIONS, fin)
    return result_json(fetch.safe_fetch(req.url, opts))
  end)

  H.assertPublicUrl = finishing(function(self, rid, req, fin)
    local opts = fetch_options(self, rid, req, { "timeoutMs" }, fin)
    return fetch.assert_public_url(req.url, opts)
  end)

  function H.pinnedTransport(self, rid, req)
    local sig = request_signal(self, rid)
    local a = req.address
    if type(a) ~= "table" then error(errors.EMBED_REQUEST .. "address must be an object", 0) end
    local res = fetch.pinned_transport(req.url, { address = a.address, family = a.family, port = a.port },
      sig, number_or_raw(req.maxBytes), req.headers)
    return result_json(res)
  end

  function H.isPublicAddress(_, _, req)
    return fetch.is_public_address(req.text)
  end

  function H.scrubDiagnostic(_, _, req)
    return scrub.scrub_diagnostic(req.text, number_or_raw(req.max))
  end

  for _, k in ipairs { "fetch", "assertPublicUrl", "pinnedTransport", "isPublicAddress", "scrubDiagnostic" } do
    U[k] = true
  end
end

---------------------------------------------------------------- scoped delegator

local LIMITS = { maxTitleChars = true, maxReportChars = true, diagnosticChars = true }
local DELEGATOR_OPTIONS = { "target", "maxRunning", "timeoutMs", "maxTitleChars", "maxReportChars", "diagnosticChars" }

local function the_delegator(self, req)
  local d = self.delegators[need_owner(req)]
  if d == nil then error(errors.EMBED_REQUEST .. "no delegator " .. req.owner, 0) end
  return d
end

local function register_delegator(H, U)
  H["delegator.new"] = function(self, _, req)
    local owner = need_owner(req)
    if self.delegators[owner] ~= nil then error(errors.EMBED_REQUEST .. "delegator " .. owner .. " exists", 0) end
    local o = type(req.options) == "table" and req.options or {}
    local cb = type(req.callbacks) == "table" and req.callbacks or {}
    local opts = {}
    for _, k in ipairs(DELEGATOR_OPTIONS) do
      local v = o[k]
      if LIMITS[k] then v = number_or_raw(v) end
      opts[k] = v
    end
    if cb.run then
      opts.run = function(task, ctx)
        local a = ctx.author or {}
        return self:host_call(owner, "run", {
          task, { channel = ctx.channel, author = { id = a.id, name = a.name, principalId = a.principalId } },
        }, ctx.signal)
      end
    end
    if cb.deliver then
      opts.deliver = function(job, outcome) self:host_call(owner, "deliver", { job, outcome }) end
    end
    if cb.logger then
      opts.logger = { error = function(message, fields) self:notify(owner, "logger.error", { message, fields }) end }
    end
    self.delegators[owner] = delegator.new(opts)
    return owner
  end

  -- A member the host sent as null reaches Lua as absent; "keys" lists the
  -- members the host's object had, so an unknown one (even null) still
  -- counts as a field the request must not have (spec 3.2 check 1).
  H["delegator.start"] = function(self, _, req)
    local d = the_delegator(self, req)
    local r = req.request
    if type(r) == "table" and type(req.keys) == "table" then
      for _, k in ipairs(req.keys) do
        if type(k) == "string" and r[k] == nil then r[k] = false end
      end
    end
    return d:start(r)
  end

  H["delegator.runningChannels"] = function(self, _, req)
    return setmetatable(the_delegator(self, req):running_channels(), core.json_array_mt)
  end

  H["delegator.idle"] = function(self, _, req)
    the_delegator(self, req):idle()
    return true
  end

  H["delegator.dispose"] = function(self, _, req)
    the_delegator(self, req):dispose()
    return true
  end

  for _, k in ipairs { "delegator.new", "delegator.start", "delegator.runningChannels", "delegator.idle",
    "delegator.dispose" } do
    U[k] = true
  end
end

-- Adds the handlers to embed.lua's table H and marks them in U as served by
-- an engine without an app.
function M.register(H, U)
  register_fetch(H, U)
  register_delegator(H, U)
  local util = { request_signal = request_signal, finishing = finishing, result_json = result_json, need_owner = need_owner }
  require("sandbox.embed._research").register(H, U, util)
  require("sandbox.embed._precheck").register(H, U, util)
  require("sandbox.embed._rich").register(H, U, util)
end

return M
