-- embed/init.lua: the Lua side of the embedding ABI (core/sbx_ffi.h, core/ffi.c).
-- It runs on the engine thread: loads the operator's config script, starts
-- the app (lua/sandbox/app.lua) with a host table whose callbacks reach the
-- embedding process as JSON events, and runs every submitted JSON request as
-- a task on the loop, emitting exactly one final result per request.
--
-- The C side hands `new` four closures:
--   c.emit(request_id, json, final [, text])  an output (final: the request's
--                                    result; text: a string result as it is,
--                                    for a caller waiting for the text itself)
--   c.ready(err|nil)                 construction finished (nil = ok)
--   c.done()                         the engine is finished: leave the loop
--   c.counters() -> in, dropped, out queue sizes (for status)
--
-- Request and output shapes are documented in core/sbx_ffi.h. The config
-- script gets the decoded options_json as its argument and may return, after
-- the app, a function called once after the app is disposed (to close what
-- the script itself opened on the loop).
local async = require "sandbox.async"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local layout = require "sandbox.runtime.layout"

local M = {}

M.ABI = 1
M.APIKEY_TIMEOUT_MS = 30000
M.STOP_GRACE_MS = 5000

local object, jsonable, json_value = json.object, json.jsonable, json.value

-- A log line's fields as a JSON object, keys sorted (an empty table too).
local function object_of(fields)
  local names = {}
  for k in pairs(fields or {}) do names[#names + 1] = k end
  table.sort(names)
  return object(names, fields or {})
end

local Engine = {}
Engine.__index = Engine

-- Options -------------------------------------------------------------------

local function decode_options(options_json)
  if options_json == nil or options_json == "" then return {} end
  local o, err = json.decode(options_json)
  if o == nil then error(errors.EMBED_OPTIONS .. tostring(err), 0) end
  if json.kind(o) ~= "object" then error(errors.EMBED_OPTIONS .. "not a JSON object", 0) end
  o = json.plain(o)
  for _, k in ipairs { "sandbox", "host" } do
    if o[k] ~= nil and type(o[k]) ~= "table" then error(errors.EMBED_OPTIONS .. k .. " must be an object", 0) end
  end
  if o.apiKey ~= nil and o.apiKey ~= "host" and o.apiKey ~= "config" then
    error('invalid options_json: apiKey must be "host" or "config"', 0)
  end
  if o.hostLogin ~= nil and type(o.hostLogin) ~= "boolean" then
    error(errors.EMBED_OPTIONS .. "hostLogin must be a boolean", 0)
  end
  if o.logger ~= nil and type(o.logger) ~= "boolean" then
    error(errors.EMBED_OPTIONS .. "logger must be a boolean", 0)
  end
  return o
end

-- Is v an app: the real one (sandbox{} returns it) or a duck-typed one with
-- the same methods (embedding specs drive the ABI with such fakes).
local METHODS = { "start", "claim", "handle", "command", "status", "dispose" }
local function is_app_like(v)
  if type(v) ~= "table" then return false end
  for _, m in ipairs(METHODS) do
    if type(v[m]) ~= "function" then return false end
  end
  return true
end

-- Runs the config script and returns the (unstarted) app, with the option
-- overrides of options_json applied through a second sandbox{} check.
local function load_app(path, opts, overrides)
  local sandbox = require "sandbox"
  local chunk, lerr = loadfile(path, "t")
  if not chunk then error(errors.CONFIG_LOAD .. tostring(lerr), 0) end
  local ok, app, on_stop = pcall(chunk, opts)
  if not ok then error(app, 0) end
  if on_stop ~= nil and type(on_stop) ~= "function" then
    error("config " .. path .. ": its second return value must be a function (called after dispose)", 0)
  end
  local real = sandbox.is_config(app)
  if not real and type(app) == "table" and not is_app_like(app) then
    app = sandbox(app)                       -- a plain option table
    real = true
  end
  if real and next(overrides) ~= nil then
    local merged = {}
    for k, v in pairs(app.options) do merged[k] = v end
    for k, v in pairs(overrides) do merged[k] = v end
    app = sandbox(merged)
  end
  if not is_app_like(app) then
    error("config " .. path .. " must return sandbox { ... }", 0)
  end
  return app, on_stop
end

-- Engine ------------------------------------------------------------------

-- new(config_path, options_json, c) -> engine. Raises the construction error
-- of the config script; the app start (which may yield) reports through
-- c.ready. With no config_path (nil or "") the engine has no app: a utility
-- engine that serves only the host facilities of embed_utilities.lua (safe
-- fetch, the scoped delegator, ...) and ping/status.
function M.new(config_path, options_json, c)
  local opts = decode_options(options_json)
  local self = setmetatable({
    c = c, pending = {}, npending = 0, keys = {}, next_key = 0,
    calls = {}, next_call = 0, signals = {}, delegators = {},
    event_request = setmetatable({}, { __mode = "k" }), stopping = false, started = false,
  }, Engine)
  if config_path == nil or config_path == "" then
    self.host = {}
    async.spawn(function()
      self.started = true
      c.ready(nil)
    end)
    return self
  end
  local overrides = {}
  for k, v in pairs(opts.sandbox or {}) do overrides[k] = v end
  if opts.apiKey == "host" then
    overrides.apiKey = function(scope) return self:ask_key(scope, nil) end
  end
  if opts.logger then
    -- the host's logger (the Bun bridge's `logger` option): every operator
    -- line as a one-way host call, owner "logger", fn the level, args
    -- [message, fields] (spec/operations.md 2)
    local lg = {}
    for _, level in ipairs { "debug", "info", "warn", "error" } do
      lg[level] = function(msg, fields) self:notify("logger", level, { msg, object_of(fields) }) end
    end
    overrides.logger = lg
  end
  self.app, self.on_stop = load_app(config_path, opts, overrides)
  self.host = self:make_host(opts)
  async.spawn(function()
    local ok, err = pcall(self.app.start, self.app, self.host)
    if ok then
      self.started = true
      c.ready(nil)
    else
      if self.on_stop then pcall(self.on_stop) end
      c.ready(type(err) == "string" and err or tostring(err))
      c.done()
    end
  end)
  return self
end

function Engine:make_host(opts)
  local h = {}
  for k, v in pairs(opts.host or {}) do h[k] = v end
  if opts.hostLogin then
    h.hostLogin = function(provider) return self:ask_key(nil, provider) end
  end
  if opts.apiKey == "host" then
    h.apiKey = function(scope) return self:ask_key(scope, nil) end
  end
  h.typing = function(event)
    local rid = self.event_request[event] or 0
    self:event(rid, "typing", { on = true })
    local stopped = false
    return function()
      if stopped then return end
      stopped = true
      self:event(rid, "typing", { on = false })
    end
  end
  return h
end

function Engine:emit(rid, obj, final, text)
  local s, err = json.encode(obj)
  if not s then
    if not final then return end
    s = assert(json.encode(object({ "type", "request", "ok", "error" },
      { type = "result", request = rid, ok = false, error = "result not encodable as JSON: " .. tostring(err) })))
    text = nil
  end
  self.c.emit(rid, s, final, text)
end

function Engine:event(rid, name, fields)
  local names, values = { "type", "request", "name" }, { type = "event", request = rid, name = name }
  local extra = {}
  for k in pairs(fields) do extra[#extra + 1] = k end
  table.sort(extra)
  for _, k in ipairs(extra) do names[#names + 1] = k values[k] = jsonable(fields[k]) end
  self:emit(rid, object(names, values), false)
end

function Engine:finish(rid, ok, value)
  if not self.pending[rid] then return end
  self.pending[rid] = nil
  self.npending = self.npending - 1
  local obj
  if ok then
    obj = object({ "type", "request", "ok", "value" },
      { type = "result", request = rid, ok = true, value = json_value(value) })
  else
    local msg, info = M.error_parts(value)
    obj = object({ "type", "request", "ok", "error", "errorInfo" },
      { type = "result", request = rid, ok = false, error = msg, errorInfo = info })
  end
  -- a string result also goes to C as it is, for a caller that asked for
  -- the text itself (sbx_engine_metrics)
  self:emit(rid, obj, true, ok and type(value) == "string" and value or nil)
end

-- An error value -> its message and, for a structured error (a table with a
-- string `message`, such as safe fetch's UnsafeUrlError or a
-- DelegationError), an errorInfo object with name, message and, where
-- present, code, status and headers.
function M.error_parts(value)
  if type(value) == "table" and type(value.message) == "string" then
    local info = object({ "name", "message", "code", "status", "headers" }, {
      name = type(value.name) == "string" and value.name or nil,
      message = value.message,
      code = type(value.code) == "string" and value.code or nil,
      status = math.type(value.status) == "integer" and value.status or nil,
      headers = type(value.headers) == "table" and jsonable(value.headers) or nil,
    })
    return value.message, info
  end
  return type(value) == "string" and value or tostring(value), nil
end

-- Host calls: the engine asks the embedding process to run one of its own
-- functions (a safe-fetch test seam, a delegator's run or deliver) and
-- yields until {"type":"callback.result","id":K,...} answers:
--   {"type":"callback.request","request":0,"id":K,"owner":O,"fn":F,"args":[...]}
-- `owner` is the name the host gave the object (the fetch or delegator) when
-- it made the request; when `signal` aborts, the host is told with
--   {"type":"callback.abort","request":0,"id":K,"owner":O,"reason":"..."}
-- and the call still waits for the answer (the host's function decides).
-- `scope` (optional) is the signal of the work the call serves (a fetch or a
-- research run request): when it aborts, the call is abandoned at once
-- ("abandoned":true in callback.abort; a later answer is ignored), so a host
-- function that ignores its signal holds nothing once that work is over. A
-- stopping engine fails every waiting call with "engine stopped".
local CallError = { __tostring = function(e) return e.message end }

-- A Lua list (list.n counts nil holes) -> a JSON array (holes become null).
local function args_array(list)
  local out = json.array()
  for i = 1, (list.n or #list) do out[i] = json_value(list[i]) end
  return out
end

local function call_error(e)
  if type(e) ~= "table" then e = { message = tostring(e) } end
  local out = { name = type(e.name) == "string" and e.name or "Error",
    message = type(e.message) == "string" and e.message or "host callback failed" }
  if type(e.code) == "string" then out.code = e.code end
  return setmetatable(out, CallError)
end

function Engine:host_call(owner, fn, args, signal, scope)
  if self.stopping then error(call_error("engine stopped"), 0) end
  self.next_call = self.next_call + 1
  local id = self.next_call
  local unhooks = {}
  local function tell_abort(reason, abandoned)
    if self.calls[id] == nil then return end
    self:emit(0, object({ "type", "request", "id", "owner", "reason", "abandoned" }, {
      type = "callback.abort", request = 0, id = id, owner = owner, reason = tostring(reason),
      abandoned = abandoned or nil,
    }), false)
  end
  local ok, value = async.await(function(resume)
    self.calls[id] = resume
    self:emit(0, object({ "type", "request", "id", "owner", "fn", "args" }, {
      type = "callback.request", request = 0, id = id, owner = owner, fn = fn,
      args = args_array(args),
    }), false)
    if signal then unhooks[#unhooks + 1] = signal:on_abort(function(reason) tell_abort(reason) end) end
    if scope then
      unhooks[#unhooks + 1] = scope:on_abort(function(reason)
        tell_abort(reason, true)
        local k = self.calls[id]
        if k then self.calls[id] = nil k(false, "abandoned: " .. tostring(reason)) end
      end)
    end
  end)
  self.calls[id] = nil
  for _, u in ipairs(unhooks) do u() end
  if not ok then error(call_error(value), 0) end
  return value
end

-- A one-way host call (a logger line): no answer is awaited.
function Engine:notify(owner, fn, args)
  if self.stopping then return end
  self:emit(0, object({ "type", "request", "id", "owner", "fn", "args" }, {
    type = "callback.request", request = 0, id = 0, owner = owner, fn = fn,
    args = args_array(args),
  }), false)
end


-- The host answers apiKey.request K with {"type":"apiKey.result","id":K,...}.
-- A missing, null, empty or non-string key, a timeout or a stop: nil (the
-- broker fails that model call closed).
function Engine:ask_key(scope, provider)
  if self.stopping then return nil end
  self.next_key = self.next_key + 1
  local id = self.next_key
  local sc = json.null
  if type(scope) == "table" then
    local sp = type(scope.speaker) == "table" and scope.speaker or {}
    sc = object({ "channel", "speaker" }, {
      channel = scope.channel,
      speaker = object({ "id", "name", "principalId" }, { id = sp.id, name = sp.name, principalId = sp.principalId }),
    })
  end
  local key = async.await(function(resume)
    local timer = core.timer(M.APIKEY_TIMEOUT_MS, function() resume(nil) end)
    self.keys[id] = function(k) timer:stop() resume(k) end
    self:emit(0, object({ "type", "request", "id", "provider", "scope" },
      { type = "apiKey.request", request = 0, id = id, provider = provider, scope = sc }), false)
  end)
  self.keys[id] = nil
  if type(key) ~= "string" or key == "" then return nil end
  return key
end

-- Request handlers: each runs inside the request's task and returns its value
-- (or raises: an ok=false result).
local function need_string(v, what)
  if type(v) ~= "string" or v == "" then error(errors.EMBED_REQUEST .. what .. " must be a non-empty string", 0) end
  return v
end

local function need_event(req)
  if type(req.event) ~= "table" then error(errors.EMBED_REQUEST .. "event must be an object", 0) end
  if req.admission ~= nil and type(req.admission) ~= "table" then
    error(errors.EMBED_REQUEST .. "admission must be an object or null", 0)
  end
  return req.event, req.admission
end

local CHANNEL_OPS = { has = "has", list = "list", enable = "enable", disable = "disable" }
local RUNTIME_OPS = {
  runTurn = "run_turn", startFresh = "start_fresh", stop = "stop", busy = "busy",
  dispose = "dispose", sweep = "sweep",
}

local HANDLERS = {}

function HANDLERS.ping() return true end

function HANDLERS.status(self)
  local st = self.app and self.app:status() or {}
  local out = {}
  if type(st) == "table" then for k, v in pairs(st) do out[k] = v end end
  local queued_in, dropped, queued_out = self.c.counters()
  out.engine = object({ "abi", "pending", "submitted", "queued", "dropped", "stopping" }, {
    abi = M.ABI, pending = self.npending, submitted = queued_in, queued = queued_out,
    dropped = dropped, stopping = self.stopping,
  })
  return out
end

-- {"type":"metrics"}: the app's Prometheus text exposition
-- (spec/operations.md 4), as the result's string value; sbx_engine_metrics
-- hands the same text to a C host without the JSON around it.
function HANDLERS.metrics(self)
  if type(self.app.metrics) ~= "function" then error("this app has no metrics", 0) end
  return self.app:metrics()
end

function HANDLERS.claim(self, _, req)
  local event, admission = need_event(req)
  return self.app:claim(event, admission)
end

function HANDLERS.message(self, rid, req)
  local event, admission = need_event(req)
  local claim = self.app:claim(event, admission)
  self:event(rid, "claim", { claim = claim })
  if type(claim) ~= "table" or not claim.claim then
    return object({ "claim", "result" }, { claim = jsonable(claim), result = json.null })
  end
  self.event_request[event] = rid
  local res = self.app:handle(event, admission)
  return object({ "claim", "result" }, { claim = jsonable(claim), result = json_value(res) })
end

function HANDLERS.command(self, _, req)
  local event, admission = need_event(req)
  return self.app:command(event, admission)
end

function HANDLERS.stop(self, _, req)
  return self.app:stop(need_string(req.channel, "channel"))
end

function HANDLERS.startFresh(self, _, req)
  return self.app:start_fresh(need_string(req.channel, "channel"))
end

function HANDLERS.background(self, _, req)
  return self.app:background(need_string(req.channel, "channel"))
end

function HANDLERS.owns(self, _, req)
  return self.app:owns(need_string(req.channel, "channel"))
end

function HANDLERS.service(self, _, req)
  local op = need_string(req.op, "op")
  local args = req.args or {}
  if type(args) ~= "table" then error(errors.EMBED_REQUEST .. "args must be an array", 0) end
  local svc = self.app.services and self.app.services.SANDBOX
  if type(svc) ~= "table" then error("the SANDBOX service is not available", 0) end
  local target, method
  if CHANNEL_OPS[op] then
    target, method = svc.channels, CHANNEL_OPS[op]
  elseif RUNTIME_OPS[op] then
    target, method = svc.runtime, RUNTIME_OPS[op]
  else
    error(errors.EMBED_REQUEST .. "unknown service op: " .. op, 0)
  end
  if type(target) ~= "table" or target[method] == nil then error("the SANDBOX service has no " .. op, 0) end
  return target[method](target, table.unpack(args, 1, #args))
end

-- {"type":"image"}: whether the started app's daemon has its image, asked
-- through the runtime's driver (spec/operations.md 6: the Bun bridge's
-- sandbox() checks it at start). A driver without inspect_image (a custom
-- or fake one) is not asked: {"image":..,"checked":false}. Otherwise
-- {"image":..,"checked":true,"present":b} and, when not present, "error":
-- the operator's message with its fix (the daemon's state when it is the
-- cause; the build command of this installation, sandbox.runtime.layout).
function HANDLERS.image(self)
  local svc = self.app.services and self.app.services.SANDBOX
  local rt = svc and svc.runtime
  local d = rt and rt.driver
  local image = rt and rt.options and rt.options.image
  if type(image) ~= "string" then return object({ "checked" }, { checked = false }) end
  if type(d) ~= "table" or type(d.inspect_image) ~= "function" then
    return object({ "image", "checked" }, { image = image, checked = false })
  end
  if d:inspect_image(image) then
    return object({ "image", "checked", "present" }, { image = image, checked = true, present = true })
  end
  local why = type(d.inspect_daemon) == "function" and select(2, d:inspect_daemon()) or nil
  local msg
  if why == "not found" or why == "cannot run" then
    msg = "the docker CLI cannot run, so the image " .. image .. " cannot be checked; fix: install docker.io (make deps)"
  elseif why == "permission denied" then
    msg = "this user may not use the Docker socket, so the image " .. image
      .. " cannot be checked; fix: add the service account to the docker group"
  elseif why ~= nil then
    msg = "the Docker daemon does not answer, so the image " .. image
      .. " cannot be checked; fix: start dockerd or fix DOCKER_HOST (sbx doctor)"
  else
    msg = "the sandbox image " .. image .. " is missing (every turn would fail); fix: build it with "
      .. layout.image_fix(image)
  end
  return object({ "image", "checked", "present", "error" }, { image = image, checked = true, present = false, error = msg })
end

-- Requests a utility engine (no config) serves: ping, status and the host
-- facilities of embed_utilities.lua.
local UTILITY = { ping = true, status = true }
require("sandbox.embed._utilities").register(HANDLERS, UTILITY)

function Engine:dispatch(rid, text)
  self.pending[rid] = true
  self.npending = self.npending + 1
  local req, err = json.decode(text)
  if json.kind(req) ~= "object" then
    self:finish(rid, false, errors.EMBED_REQUEST .. (err or "not a JSON object"))
    return
  end
  req = json.plain(req)
  local kind = req.type
  if kind == "apiKey.result" then
    local k = math.type(req.id) == "integer" and self.keys[req.id] or nil
    if k then k(req.key) end
    self:finish(rid, true, k ~= nil)
    return
  end
  if kind == "callback.result" then
    local k = math.type(req.id) == "integer" and self.calls[req.id] or nil
    if k then
      self.calls[req.id] = nil
      if req.ok == true then k(true, req.value) else k(false, req.error) end
    end
    self:finish(rid, true, k ~= nil)
    return
  end
  if kind == "cancel" then
    local sig = math.type(req.target) == "integer" and self.signals[req.target] or nil
    if sig then sig:abort(type(req.reason) == "string" and req.reason or "aborted") end
    self:finish(rid, true, sig ~= nil)
    return
  end
  local h = type(kind) == "string" and HANDLERS[kind] or nil
  if h == nil then
    self:finish(rid, false, errors.EMBED_REQUEST .. "unknown type: " .. tostring(kind))
    return
  end
  if self.stopping then
    self:finish(rid, false, "engine stopped")
    return
  end
  if self.app == nil and not UTILITY[kind] then
    self:finish(rid, false, "this engine has no app: it was created without a config script")
    return
  end
  local task = async.spawn(h, self, rid, req)
  async.on_done(task, function(t)
    self.signals[rid] = nil
    self:finish(rid, t.ok, t.results[2])
  end)
end

-- Stop: dispose the app (running turns end, containers removed), fail the
-- pending apiKey requests closed, give running requests a grace period to
-- return their own results, fail the rest with "engine stopped", done.
function Engine:stop()
  if self.stopping then return end
  self.stopping = true
  async.spawn(function()
    for id, k in pairs(self.keys) do self.keys[id] = nil k(nil) end
    for id, k in pairs(self.calls) do self.calls[id] = nil k(false, "engine stopped") end
    for _, sig in pairs(self.signals) do sig:abort("engine stopped") end
    for _, d in pairs(self.delegators) do
      local ok, err = pcall(d.dispose, d)
      if not ok then core.log("warn", "embedding: a delegator's dispose failed: " .. tostring(err)) end
    end
    if self.started and self.app then
      local ok, err = pcall(self.app.dispose, self.app)
      if not ok then core.log("warn", "embedding: dispose failed: " .. tostring(err)) end
    end
    if self.on_stop then
      local ok, err = pcall(self.on_stop)
      if not ok then core.log("warn", "embedding: the config's stop hook failed: " .. tostring(err)) end
    end
    local waited = 0
    while self.npending > 0 and waited < M.STOP_GRACE_MS do
      async.sleep(10)
      waited = waited + 10
    end
    local left = {}
    for rid in pairs(self.pending) do left[#left + 1] = rid end
    table.sort(left)
    for _, rid in ipairs(left) do self:finish(rid, false, "engine stopped") end
    self.c.done()
  end)
end

return M
