-- stall_server.lua: drives spec/fixtures/stall_server.mjs, the loopback
-- servers that make a connection hang, stay silent or reset (see the
-- fixture's header for each port).
--
--   local stall = require "stall_server"
--   local s = stall.start({ tls = fake_upstream.make_ca(dir) })   -- tls optional
--   s.stall_port, s.silent_port, s.reset_port, s.early_port, s.http_port, s.tls_port
--   async.run(function() s:reset(); ...; local n = s:stats() end)  -- inside a task
--   s:stop()
--
-- stats() and reset() return the connections each port accepted, as
-- { silent =, reset =, early =, http =, tls = }. They go through
-- core.http_post, not through the safe fetch under test. The process is
-- spawned with io.popen; it exits by itself once this Lua process is gone.
local fake = require "fake_upstream"

local M = {}

local FIXTURE = "spec/fixtures/stall_server.mjs"
local PORTS = { "stall_port", "silent_port", "reset_port", "early_port", "http_port", "tls_port", "ctl_port" }

local Stall = {}
Stall.__index = Stall

function Stall:control(path)
  local res = fake.post {
    url = string.format("http://127.0.0.1:%d%s", self.ctl_port, path),
    allow_http = true, body = "{}", timeout_ms = 5000,
    headers = { "Content-Type: application/json" },
  }
  if not res.ok then
    error(string.format("stall_server %s failed: %s %s", path, tostring(res.error), tostring(res.status)), 2)
  end
  return fake.decode(res.body)
end

function Stall:stats() return self:control("/stats") end
function Stall:reset() return self:control("/reset") end

Stall.stop = fake.stop_process
Stall.__gc = Stall.stop

-- stall.start({ tls = { cert =, key = } }) -> server
function M.start(opts)
  opts = opts or {}
  local pipe, line = fake.spawn(FIXTURE, opts, "stall_server")
  local s = setmetatable({ pipe = pipe, pid = tonumber(line:match('"pid":(%d+)')),
    fillers = tonumber(line:match('"fillers":(%d+)')) }, Stall)
  for _, name in ipairs(PORTS) do s[name] = tonumber(line:match('"' .. name .. '":(%d+)')) end
  if not (s.pid and s.stall_port and s.http_port and s.ctl_port) then
    if s.pid then s:stop() else s.pipe = nil; pipe:close() end
    error("stall_server: unexpected first line: " .. line, 2)
  end
  return s
end

-- Sockets of this network namespace still in SYN-SENT towards
-- 127.0.0.1:port (from /proc/net/tcp): a cancelled connect must leave none.
function M.syn_sent(port)
  local f = assert(io.open("/proc/net/tcp", "r"))
  local want, n = string.format("0100007F:%04X", port), 0
  for l in f:lines() do
    local rem, st = l:match("^%s*%d+:%s+%x+:%x+%s+(%x+:%x+)%s+(%x+)")
    if rem == want and st == "02" then n = n + 1 end
  end
  f:close()
  return n
end

return M
