-- rich/docker.lua: sandbox.rich.dockerDriver{socket=, labelProfile=, log=},
-- the built-in driver of rich mode (spec/rich-mode.md 5.1, 5.4): the Engine
-- API over the local daemon's Unix socket, through the same one-connection-
-- per-call HTTP/1.1 transport as the sealed Engine API driver
-- (drivers/engine.lua's http), every call bounded by 15 s. The container is
-- long-lived: ensureRunning keeps a running container of the same image and
-- profile, and replaces any other. Every container it creates runs under
-- the rich image's own seccomp allow-list (worker/pi/seccomp.json, or
-- opts.seccompProfile, an absolute path), read once here: a missing,
-- unreadable or malformed profile raises `seccomp profile missing: <path>`
-- (`... invalid: <path>`) at construction, never a fallback to Docker's default.
--
--   local d = rich.dockerDriver { socket = "/var/run/docker.sock" }
--   d.ensureRunning(spec)   d.status(name) -> {state, image?, profile?}
--   d.remove(name)          d.logs(name, lines) -> text
-- A status that is neither a success nor accepted raises
-- "docker <METHOD> <target> failed with <status>: <first 300 characters of the body>".
local container = require "sandbox.rich._container"
local core = require "sandbox.core"
local engine = require "sandbox.drivers.engine"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local seccomp = require "sandbox.runtime._seccomp"

local M = {}

M.DEFAULT_SOCKET = "/var/run/docker.sock"
M.CALL_TIMEOUT_MS = 15000
M.MAX_ANSWER = 1024 * 1024
M.MAX_LOGS = 8 * 1024 * 1024
M.BODY_CHARS = 300

local function fail(msg) error(msg, 0) end

local function urlencode(s)
  return (s:gsub("[^%w%-_.~]", function(c) return string.format("%%%02X", c:byte()) end))
end

local function first_chars(s, n)
  if utf8.len(s) == nil then return s:sub(1, n) end
  local stop = utf8.offset(s, n + 1)
  return stop and s:sub(1, stop - 1) or s
end

local function check_name(name)
  if not container.name_ok(name) then fail(errors.RICH_SPEC) end
end

function M.new(opts)
  opts = opts or {}
  local http = engine.new { socket = opts.socket or M.DEFAULT_SOCKET }
  local label_profile = opts.labelProfile or "roundtable.sandbox.profile"
  local log_option = opts.log
  local timeout = opts.callTimeoutMs or M.CALL_TIMEOUT_MS
  local profile = seccomp.load(opts.seccompProfile or seccomp.default_path("rich"))
  local d = { socket = http.socket, seccomp = { path = profile.path, count = profile.count } }

  -- One call: the status and body when the status is accepted, else raises.
  local function call(method, target, accepted, o)
    o = o or {}
    local status, body = http:http(method, target, { body = o.body, max = o.max or M.MAX_ANSWER, timeout_ms = timeout })
    if not status then fail(errors.RICH_DOCKER .. method .. " " .. target .. " failed: " .. tostring(body)) end
    if not accepted[status] then
      fail(string.format("%s%s %s failed with %d: %s", errors.RICH_DOCKER, method, target, status, first_chars(body or "", M.BODY_CHARS)))
    end
    return status, body
  end

  function d.status(name)
    check_name(name)
    local status, body = call("GET", "/containers/" .. name .. "/json", { [200] = true, [404] = true })
    if status == 404 then return { state = "missing" } end
    local v = json.decode(body)
    if json.kind(v) ~= "object" then fail(errors.RICH_DOCKER .. "GET /containers/" .. name .. "/json answered no container") end
    local state = json.kind(v.State) == "object" and v.State.Running == true and "running" or "stopped"
    local cfg = json.kind(v.Config) == "object" and v.Config or {}
    local labels = json.kind(cfg.Labels) == "object" and cfg.Labels or {}
    local out = { state = state }
    if type(cfg.Image) == "string" then out.image = cfg.Image end
    if type(labels[label_profile]) == "string" then out.profile = labels[label_profile] end
    return out
  end

  function d.remove(name)
    check_name(name)
    call("DELETE", "/containers/" .. name .. "?force=true", { [200] = true, [204] = true, [404] = true })
  end

  function d.ensureRunning(spec)
    local logcfg = container.check(spec, log_option)
    local body = container.create_body(spec, logcfg, seccomp.security_opt(profile))
    local st = d.status(spec.name)
    if st.state == "running" and st.image == spec.image and st.profile == spec.profile then return end
    if st.state ~= "missing" then d.remove(spec.name) end
    call("POST", "/containers/create?name=" .. urlencode(spec.name), { [201] = true }, { body = body })
    call("POST", "/containers/" .. spec.name .. "/start", { [204] = true, [304] = true })
  end

  function d.logs(name, lines)
    check_name(name)
    local n = math.max(1, math.floor(tonumber(lines) or 1))
    local status, body = call("GET", string.format("/containers/%s/logs?stdout=1&stderr=1&tail=%d", name, n),
      { [200] = true, [404] = true }, { max = M.MAX_LOGS })
    if status == 404 then return "" end
    return core.docker_demux(body)
  end

  return d
end

return setmetatable(M, { __call = function(_, opts) return M.new(opts) end })
