-- drivers/engine.lua: the optional Engine API driver (spec/runtime.md 4.1,
-- 4.3 table, 4.6 "Engine API driver, same contract", 4.7 with DELETE, 6.3
-- step 1 with GET). It talks HTTP/1.1 to the local daemon's Unix socket
-- over core.unix_stream, one connection per call (`Connection: close`), and
-- is the primitives of drivers/contract.lua, so it makes the identical
-- container by the identical algorithms as the CLI driver.
--
--   local engine = require "sandbox.drivers.engine"
--   local d = engine { socket = "/var/run/docker.sock" }   -- default: DOCKER_HOST
--                                                          -- unix://..., else that path
--   d:run(spec, turn, signal) / d:list(installation) / d:remove(name)
--   d:ensure_running(spec, logcfg, label) / d:status(name, label) / d:logs(name, n)
--                        the long-lived lifecycle (drivers/_lasting.lua,
--                        rich-mode.md 5.4): GET /containers/<name>/json,
--                        POST create and start, DELETE ?force=true, GET logs,
--                        each within call_timeout_ms (default 15000)
--
-- The attach stream is hijacked: stdin is written only after the daemon's
-- 101 answer has been read (the daemon drops bytes sent before it), then the
-- write side is half-closed; output frames (8-byte headers: stream type,
-- big-endian length) are demultiplexed into the 2 MiB / 128 KiB limits as
-- they arrive. An abort closes every connection of the run at once.
local async = require "sandbox.async"
local container = require "sandbox.drivers._sealed"
local contract = require "sandbox.drivers.contract"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local lasting = require "sandbox.drivers._lasting"
local rich = require "sandbox.drivers._rich"

local M = {}

M.DEFAULT_SOCKET = "/var/run/docker.sock"
M.MAX_CONTROL = 65536
M.MAX_LIST = contract.MAX_LIST
M.MAX_HEAD = 65536
M.CONTROL_TIMEOUT_MS = 30000
M.CALL_TIMEOUT_MS = 15000       -- each call of the long-lived lifecycle (rich-mode.md 5.4)
M.MAX_ANSWER = 1024 * 1024
M.MAX_LOGS = 8 * 1024 * 1024
M.BODY_CHARS = 300

local Driver = contract.methods({})
Driver.__index = Driver

local function fail(msg) error(msg, 0) end

function M.new(opts)
  opts = opts or {}
  local getenv = opts.getenv or os.getenv
  local sock = opts.socket
  if sock == nil then
    local host = getenv("DOCKER_HOST")
    sock = host and host ~= "" and host:match("^unix://(/.*)$") or M.DEFAULT_SOCKET
  end
  return setmetatable({
    socket = sock, getenv = getenv, builtin = true,
    remove_timeout_ms = opts.remove_timeout_ms or contract.REMOVE_TIMEOUT_MS,
    list_timeout_ms = opts.list_timeout_ms or contract.LIST_TIMEOUT_MS,
    call_timeout_ms = opts.call_timeout_ms or M.CALL_TIMEOUT_MS,
  }, Driver)
end

function Driver:check_endpoint()
  if not contract.local_endpoint(self.getenv("DOCKER_HOST")) then fail(contract.E_REMOTE) end
end

-- Splits a response into status, headers (lowercase names) and body;
-- de-chunks a chunked body. nil on anything malformed.
local function parse_response(data)
  local head_end = data:find("\r\n\r\n", 1, true)
  if not head_end then return nil end
  local head, body = data:sub(1, head_end - 1), data:sub(head_end + 4)
  local status = head:match("^HTTP/1%.[01] (%d%d%d)")
  if not status then return nil end
  local headers = {}
  for line in head:gmatch("\r\n([^\r\n]*)") do
    local k, v = line:match("^([^:]+):%s*(.-)%s*$")
    if k then headers[k:lower()] = v end
  end
  if (headers["transfer-encoding"] or ""):lower():find("chunked") then
    local out, pos = {}, 1
    while true do
      local size_hex, line_end = body:match("^(%x+)[^\r\n]*\r\n()", pos)
      if not size_hex or #size_hex > 8 then return nil end
      local size = tonumber(size_hex, 16)
      if size == 0 then break end
      if #body < line_end + size + 1 then return nil end
      out[#out + 1] = body:sub(line_end, line_end + size - 1)
      pos = line_end + size + 2
    end
    body = table.concat(out)
  elseif headers["content-length"] then
    local n = tonumber(headers["content-length"])
    if not n or #body < n then return nil end
    body = body:sub(1, n)
  end
  return tonumber(status), headers, body
end

-- A run's set of open connections; close_all() ends every pending call.
local function new_group()
  return { conns = {} }
end

local function close_all(group)
  group.closed = true
  local list = {}
  for cancel in pairs(group.conns) do list[#list + 1] = cancel end
  group.conns = {}
  for _, cancel in ipairs(list) do cancel() end
end

-- One request on its own connection; yields until the answer (or failure).
-- o = {body=, max=, timeout_ms=, group=}. Returns status, body or nil, why
-- ("connect", "io", "timeout", "too large", "closed", "malformed").
function Driver:http(method, target, o)
  o = o or {}
  local body = o.body or ""
  local req = method .. " " .. target .. " HTTP/1.1\r\nHost: docker\r\n"
    .. (o.body and "Content-Type: application/json\r\n" or "")
    .. "Content-Length: " .. #body .. "\r\nConnection: close\r\n\r\n" .. body
  local limit = (o.max or M.MAX_CONTROL) + M.MAX_HEAD
  if o.group and o.group.closed then return nil, "closed" end
  local result = table.pack(async.await(function(resume)
    local chunks, size, stream, timer = {}, 0, nil, nil
    local function finish(...)
      if timer then timer:stop(); timer = nil end
      if o.group and stream then o.group.conns[stream.cancel] = nil end
      resume(...)
    end
    local handle = core.unix_stream(self.socket, function(ev, data)
      if ev == "data" then
        size = size + #data
        if size > limit then
          stream.h:close()
          finish(nil, "too large")
          return
        end
        chunks[#chunks + 1] = data
      else
        if data then finish(nil, data) return end
        local status, _, b = parse_response(table.concat(chunks))
        if not status then finish(nil, "malformed") return end
        finish(status, b)
      end
    end)
    if not handle then resume(nil, "connect") return end
    stream = { h = handle }
    stream.cancel = function() handle:close(); finish(nil, "closed") end
    if o.group then o.group.conns[stream.cancel] = true end
    handle:write(req)
    if o.timeout_ms then
      timer = core.timer(o.timeout_ms, function()
        timer = nil
        handle:close()
        finish(nil, "timeout")
      end)
    end
  end))
  return table.unpack(result, 1, result.n)
end

-- One DELETE attempt: "ok", "retry" or "fail" (4.7).
function Driver:remove_once(name)
  local status, body = self:http("DELETE", "/containers/" .. name .. "?force=1",
    { max = contract.MAX_RM_STDERR, timeout_ms = self.remove_timeout_ms })
  if not status then return "fail" end
  if status == 204 or status == 404 then return "ok" end
  if status == 409 and body:lower():find("removal.*already in progress") then return "retry" end
  return "fail"
end

local function urlencode(s)
  return (s:gsub("[^%w%-_.~]", function(c) return string.format("%%%02X", c:byte()) end))
end

function Driver:list_once(installation)
  local filters = '{"label":["' .. container.LABEL_INSTALLATION .. "=" .. installation .. '"]}'
  local status, body = self:http("GET", "/containers/json?all=1&filters=" .. urlencode(filters),
    { max = M.MAX_LIST, timeout_ms = self.list_timeout_ms })
  if status ~= 200 then return nil end
  local v = json.decode(body)
  if json.kind(v) ~= "array" then return nil end
  local out = {}
  for _, c in ipairs(v) do
    local name = type(c.Names) == "table" and type(c.Names[1]) == "string" and c.Names[1]:gsub("^/", "") or ""
    local labels = type(c.Labels) == "table" and c.Labels or {}
    local owner = labels[container.LABEL_OWNER]
    out[#out + 1] = { name = name, owner = type(owner) == "string" and owner or "" }
  end
  return out
end

-- The hijacked attach stream. Returns an object whose :wait_ready() yields
-- until the 101 head (true) or failure (false), and :wait_end() until the
-- stream ended; .stdout, .stdout_truncated, .stderr_truncated, .bad.
local function attach(self, name, group, max_stdout)
  local a = { out = {}, out_len = 0, err_len = 0, ready = nil, ended = false, waiters = {} }
  local buf, head_done = "", false
  local function notify()
    local ws = a.waiters
    a.waiters = {}
    for _, w in ipairs(ws) do w() end
  end
  local function over()
    close_all(group)
  end
  local function frames()
    local pos = 1
    while #buf - pos + 1 >= 8 do
      local t = buf:byte(pos)
      local n = string.unpack(">I4", buf, pos + 4)
      if #buf - pos + 1 < 8 + n then break end
      if t == 1 then
        if a.out_len + n > max_stdout then a.stdout_truncated = true; over(); return end
        a.out[#a.out + 1] = buf:sub(pos + 8, pos + 7 + n)
        a.out_len = a.out_len + n
      elseif t == 2 then
        if a.err_len + n > contract.MAX_STDERR then a.stderr_truncated = true; over(); return end
        a.err_len = a.err_len + n
      else
        a.bad = true
        over()
        return
      end
      pos = pos + 8 + n
    end
    buf = buf:sub(pos)
    -- a frame header announcing more than a limit is refused before its body
    if #buf >= 8 then
      local t, n = buf:byte(1), string.unpack(">I4", buf, 5)
      if (t == 1 and a.out_len + n > max_stdout) then a.stdout_truncated = true; over()
      elseif (t == 2 and a.err_len + n > contract.MAX_STDERR) then a.stderr_truncated = true; over() end
    end
  end
  local handle = core.unix_stream(self.socket, function(ev, data)
    if ev == "data" then
      buf = buf .. data
      if not head_done then
        local e = buf:find("\r\n\r\n", 1, true)
        if not e then
          if #buf > M.MAX_HEAD then a.ready = false; over(); notify() end
          return
        end
        local status = buf:match("^HTTP/1%.[01] (%d%d%d)")
        head_done = true
        buf = buf:sub(e + 4)
        a.ready = status == "101"
        if not a.ready then over() end
        notify()
        if not a.ready then return end
      end
      frames()
    else
      if a.ready == nil then a.ready = false end
      a.ended = true
      group.conns[a.cancel] = nil
      notify()
    end
  end)
  if not handle then
    a.ready, a.ended = false, true
    return a
  end
  a.handle = handle
  a.cancel = function()
    handle:close()
    if a.ready == nil then a.ready = false end
    a.ended = true
    notify()
  end
  group.conns[a.cancel] = true
  handle:write("POST /containers/" .. name .. "/attach?stream=1&stdin=1&stdout=1&stderr=1 HTTP/1.1\r\n"
    .. "Host: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n")
  function a.wait_ready()
    if a.ready == nil then async.await(function(resume) a.waiters[#a.waiters + 1] = resume end) end
    return a.ready
  end
  function a.wait_end()
    while not a.ended do async.await(function(resume) a.waiters[#a.waiters + 1] = resume end) end
  end
  return a
end

-- Primitives of drivers/contract.lua ---------------------------------------

-- POST /containers/create (4.6 step 3, first call). An abort from here on
-- closes every connection of the run (step 4).
function Driver:create(c, signal)
  local group = new_group()
  local h = { name = c.name, group = group }
  h.unregister = signal and signal:on_abort(function() close_all(group) end)
  local status = self:http("POST", "/containers/create?name=" .. c.name,
    { body = container.body(c), group = group, timeout_ms = M.CONTROL_TIMEOUT_MS })
  h.create_status = status
  if status ~= 201 then h.failed = true end
  return h
end

-- Attach, wait on its own connection, start (204), then the turn on the
-- attach stream and a half-close (4.6 steps 3 and 5).
function Driver:start(h, input, max_stdout)
  if h.failed then return end
  local a = attach(self, h.name, h.group, max_stdout or contract.MAX_STDOUT)
  if not a.wait_ready() then
    a.wait_end()
    h.failed = true
    return
  end
  local wait_task = async.spawn(function()
    return self:http("POST", "/containers/" .. h.name .. "/wait?condition=next-exit", { group = h.group })
  end)
  local status = self:http("POST", "/containers/" .. h.name .. "/start",
    { group = h.group, timeout_ms = M.CONTROL_TIMEOUT_MS })
  if status ~= 204 then
    close_all(h.group)
    a.wait_end()
    async.wait(wait_task)
    h.failed = true
    return
  end
  h.attach, h.wait_task = a, wait_task
  if input ~= nil then self:feed(h, input) end
end

-- The turn on the attach stream, then a half-close (a warm container's
-- turn, or start's own input).
function Driver:feed(h, input)
  local a = h.attach
  if not a or a.ended or h.fed then return false end
  h.fed = true
  if not a.handle:write(input) then return false end
  a.handle:shutdown()
  return true
end

-- The demultiplexed stdout once the attach stream ended (4.6 step 6).
function Driver:read(h)
  local a = h.attach
  if not a then return "", false end
  a.wait_end()
  return table.concat(a.out), a.stdout_truncated or a.stderr_truncated
end

-- StatusCode of the wait answer; nil for a missing or failed wait, or when
-- the attach stream carried another stream type (4.6 table, step 8).
function Driver:wait(h)
  return self:wait_within(h, nil)
end

-- The same, giving up after ms (nil: no bound) with nil.
function Driver:wait_within(h, ms)
  if not h.wait_task then return nil end
  if ms and not contract.finished_within(h.wait_task, ms) then return nil end
  local _, wstatus, wbody = async.wait(h.wait_task)
  if h.attach.bad or wstatus ~= 200 then return nil end
  local v = json.decode(wbody)
  if json.kind(v) == "object" and math.type(v.StatusCode) == "integer" then return v.StatusCode end
  return nil
end


-- Why the run failed, as the daemon tells it (contract.lua's diagnose): a
-- create the daemon answered 404 -> "image", one it never answered ->
-- "daemon"; exit 137 with an oom event of this container -> "oom".
function Driver:diagnose(h, c, exit, since)
  if h.failed and h.create_status == 404 then return "image" end
  if h.failed and h.create_status == nil then return "daemon" end
  if exit == 137 then
    local filters = '{"container":["' .. c.name .. '"],"event":["oom"]}'
    local status, body = self:http("GET", "/events?since=" .. since .. "&until=" .. (os.time() + 1)
      .. "&filters=" .. urlencode(filters), { max = M.MAX_CONTROL, timeout_ms = M.CONTROL_TIMEOUT_MS })
    if status == 200 and body:find('"oom"', 1, true) then return "oom" end
  end
  return nil
end

-- The daemon's version and data root (GET /info), as the CLI driver's
-- inspect_daemon: {version=, root=} or nil, "no answer".
function Driver:inspect_daemon()
  local status, body = self:http("GET", "/info", { max = 1048576, timeout_ms = M.CONTROL_TIMEOUT_MS })
  if status ~= 200 then return nil, "no answer" end
  local v = json.decode(body)
  if json.kind(v) ~= "object" then return nil, "no answer" end
  return { version = type(v.ServerVersion) == "string" and v.ServerVersion or nil,
           root = type(v.DockerRootDir) == "string" and v.DockerRootDir or nil }
end

-- True when the daemon has the image (GET /images/<name>/json).
function Driver:inspect_image(image)
  local status = self:http("GET", "/images/" .. urlencode(image) .. "/json",
    { max = 1048576, timeout_ms = M.CONTROL_TIMEOUT_MS })
  return status == 200
end

-- The runtimes the daemon has registered (GET /info .Runtimes), as the
-- CLI driver's runtimes: {name = {path=, args=}} or nil, "no answer".
function Driver:runtimes()
  local status, body = self:http("GET", "/info", { max = 1048576, timeout_ms = M.CONTROL_TIMEOUT_MS })
  if status ~= 200 then return nil, "no answer" end
  local v = json.decode(body)
  if json.kind(v) ~= "object" then return nil, "no answer" end
  return contract.runtime_set(v.Runtimes)
end

-- Long-lived primitives of drivers/_lasting.lua (rich-mode.md 5.4) -------

-- One call within call_timeout_ms: the status and body when the status is
-- accepted, else raises "docker <METHOD> <target> failed with <status>:
-- <first 300 characters of the body>" (or "failed: <why>" with no answer).
function Driver:call(method, target, accepted, o)
  o = o or {}
  local status, body = self:http(method, target,
    { body = o.body, max = o.max or M.MAX_ANSWER, timeout_ms = self.call_timeout_ms })
  if not status then fail(errors.RICH_DOCKER .. method .. " " .. target .. " failed: " .. tostring(body)) end
  if not accepted[status] then
    fail(string.format("%s%s %s failed with %d: %s", errors.RICH_DOCKER, method, target, status,
      lasting.first_chars(body or "", M.BODY_CHARS)))
  end
  return status, body
end

function Driver:render_lasting(spec, logcfg)
  return rich.render(spec, logcfg, rich.body)
end

function Driver:inspect_container(name)
  local target = "/containers/" .. name .. "/json"
  local status, body = self:call("GET", target, { [200] = true, [404] = true })
  if status == 404 then return nil end
  local facts = lasting.facts(json.decode(body))
  if not facts then fail(errors.RICH_DOCKER .. "GET " .. target .. " answered no container") end
  return facts
end

function Driver:create_lasting(r)
  self:call("POST", "/containers/create?name=" .. urlencode(r.name), { [201] = true }, { body = r.rendered })
end

function Driver:start_lasting(name)
  self:call("POST", "/containers/" .. name .. "/start", { [204] = true, [304] = true })
end

function Driver:remove_lasting(name)
  self:call("DELETE", "/containers/" .. name .. "?force=true", { [200] = true, [204] = true, [404] = true })
end

function Driver:lasting_logs(name, n)
  local status, body = self:call("GET", string.format("/containers/%s/logs?stdout=1&stderr=1&tail=%d", name, n),
    { [200] = true, [404] = true }, { max = M.MAX_LOGS })
  if status == 404 then return "" end
  return core.docker_demux(body)
end

function Driver:release(h)
  if h.unregister then h.unregister() end
  h.unregister = nil
  close_all(h.group)
end

M.parse_response = parse_response

return setmetatable(M, { __call = function(_, opts) return M.new(opts) end })
