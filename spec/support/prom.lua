-- prom.lua: what the metrics specs share (spec/metrics_spec.lua,
-- spec/docker/prometheus_spec.lua): reading one sample out of a text
-- exposition, a real HTTP GET with Debian's curl, `promtool check metrics`,
-- and a real Prometheus server (Debian's `prometheus`) on loopback with a
-- temporary storage directory, scraping one target. Every child runs through
-- core.spawn, so the engine's loop keeps serving while a spec waits, and
-- every wait is bounded.
--
--   local P = require "prom"
--   P.value(text, 'sbx_turns_total{reason="ok"}') -> number | nil
--   P.get(url [, {args}]) -> {status=, content_type=, body=}      (yields)
--   P.promtool_check(text) -> exit status, output                 (yields)
--   P.free_port() -> a loopback port nothing listened on a moment ago
--   local srv = P.prometheus { target = "127.0.0.1:PORT", dir = DIR [, rules = FILE] }   (yields)
--   srv:query("sbx_turns_total") -> the decoded /api/v1/query answer    (yields)
--   srv:wait_for(query, pred, what)  srv:stop()                          (yields)
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"

local P = {}

P.CURL = "/usr/bin/curl"
P.PROMTOOL = "/usr/bin/promtool"
P.PROMETHEUS = "/usr/bin/prometheus"

function P.have(path)
  local st = core.fs_stat(path)
  return st ~= nil and st.type == "file"
end

-- The value of the sample `series` (name and labels exactly as exposed).
function P.value(text, series)
  for line in text:gmatch("[^\n]+") do
    if line:sub(1, #series + 1) == series .. " " then return tonumber(line:sub(#series + 2)) end
  end
  return nil
end

-- Runs file with args (stdin bytes optional) and returns its result table
-- (core.spawn's on_exit), within timeout_ms (then killed).
function P.spawn(file, args, stdin, timeout_ms)
  return async.await(function(resume)
    local proc
    local timer = core.timer(timeout_ms or 30000, function() if proc then proc:kill(core.SIGKILL) end end)
    proc = core.spawn {
      file = file, args = args, stdin = stdin, env = { "PATH=/usr/bin:/bin", "LC_ALL=C" },
      max_stdout = 8 * 1024 * 1024,
      on_exit = function(res) timer:stop() resume(res) end,
    }
  end)
end

-- GET url with curl: {status, content_type, body}; status 0 when nothing answered.
function P.get(url, extra)
  local args = { "-s", "-g", "--max-time", "10", "-o", "-", "-w", "\n%{http_code} %{content_type}" }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  args[#args + 1] = url
  local res = P.spawn(P.CURL, args, nil, 20000)
  local out = res.stdout or ""
  local body, status, ctype = out:match("^(.*)\n(%d%d%d) ?([^\n]*)$")
  return { status = tonumber(status) or 0, content_type = ctype, body = body or "", exit = res.exit_status }
end

function P.promtool_check(text)
  local res = P.spawn(P.PROMTOOL, { "check", "metrics" }, text, 30000)
  return res.exit_status, (res.stdout or "") .. (res.stderr or "")
end

function P.free_port()
  local s = assert(core.http_server { on_request = function(req) req:reply(404, "") end })
  local port = s:port()
  s:close()
  return port
end

local Server = {}
Server.__index = Server

-- A Prometheus server on 127.0.0.1:<free port> scraping o.target every
-- second, its storage and config under o.dir (the caller removes o.dir).
-- Waits (at most 60 s) until its readiness endpoint answers 200.
function P.prometheus(o)
  local port = P.free_port()
  local cfg = o.dir .. "/prometheus.yml"
  local f = assert(io.open(cfg, "w"))
  -- o.rules: a rule file Prometheus loads (its groups then answer /api/v1/rules)
  local rules = o.rules and string.format("rule_files: [%q]\n", o.rules) or ""
  f:write(rules .. string.format([[
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: sbx
    metrics_path: /metrics
    static_configs:
      - targets: ["%s"]
]], o.target))
  f:close()
  local self = setmetatable({ port = port, dir = o.dir, base = "http://127.0.0.1:" .. port }, Server)
  self.proc = core.spawn {
    file = P.PROMETHEUS,
    args = { "--config.file=" .. cfg, "--storage.tsdb.path=" .. o.dir .. "/data",
             "--web.listen-address=127.0.0.1:" .. port, "--log.level=warn" },
    env = { "PATH=/usr/bin:/bin", "HOME=" .. o.dir },
    max_stdout = 1048576, max_stderr = 1048576,
    on_exit = function(res) self.exited = res end,
  }
  local deadline = core.now() + 60000
  while core.now() < deadline and not self.exited do
    if P.get(self.base .. "/-/ready").status == 200 then return self end
    async.sleep(200)
  end
  local why = self.exited and ("exited: " .. tostring(self.exited.stderr)) or "not ready within 60 s"
  self:stop()
  error("prometheus did not start: " .. why, 0)
end

-- GET /api/v1/query?query=q, decoded.
function Server:query(q)
  local r = P.get(self.base .. "/api/v1/query", { "--data-urlencode", "query=" .. q, "-G" })
  if r.status ~= 200 then return nil, r.status .. " " .. r.body end
  return json.decode(r.body)
end

-- The loaded rule groups (GET /api/v1/rules), decoded.
function Server:rules()
  local r = P.get(self.base .. "/api/v1/rules")
  if r.status ~= 200 then return nil, r.status .. " " .. r.body end
  return json.decode(r.body)
end

-- Polls the query (every 500 ms, at most timeout_ms, default 60 s) until
-- pred(answer) is true; returns the answer or raises naming `what`.
function Server:wait_for(q, pred, what, timeout_ms)
  local deadline = core.now() + (timeout_ms or 60000)
  local last
  while core.now() < deadline do
    last = self:query(q)
    if last and pred(last) then return last end
    async.sleep(500)
  end
  error("prometheus never showed " .. what .. "; last answer: " .. tostring(last and json.encode(last)), 0)
end

-- The target's health as Prometheus sees it ("up", "down", "unknown").
function Server:target_health()
  local r = P.get(self.base .. "/api/v1/targets")
  local doc = r.status == 200 and json.decode(r.body) or nil
  local t = doc and doc.data and doc.data.activeTargets and doc.data.activeTargets[1]
  return t and t.health, t and t.lastError
end

-- Ends the server (SIGTERM, then SIGKILL after 10 s) and waits for it.
function Server:stop()
  if not self.proc or self.exited then return end
  self.proc:kill(core.SIGTERM)
  local deadline = core.now() + 10000
  while not self.exited and core.now() < deadline do async.sleep(100) end
  if not self.exited then
    self.proc:kill(core.SIGKILL)
    deadline = core.now() + 5000
    while not self.exited and core.now() < deadline do async.sleep(100) end
  end
end

return P
