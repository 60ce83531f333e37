-- mcp_server.lua: starts spec/fixtures/mcp_server.mjs, a real MCP server built
-- on the official SDK (stateless Streamable HTTP, JSON responses), for specs.
--
--   local mcp = require "mcp_server"
--   local ok, why = mcp.available()      -- false + reason if node or the SDK is missing
--   local s = mcp.start{ require_key = "k" }   -- raises if it cannot start
--   local e = mcp.start{ sse = true }          -- answers as one SSE event
--   s.url    -- http://127.0.0.1:PORT/mcp
--   s.raw_url -- http://127.0.0.1:PORT/raw: answers what s:queue_raw queued
--   s.port, s.pid
--   s:log()  -- inside an async task: the array of requests the server got on
--               /mcp, each {method, path, authorization, headers, body, raw}
--               (header names lowercase), or nil, err; uses core.http_post
--               and decodes with lua-cjson
--   s:queue_raw{status=, contentType=, headers=, body=}  -- inside a task: the
--               exact answer of the next request to /raw
--   s:stop() -- kills the server; idempotent
--
-- The server is started in the background (so closing the popen handle never
-- waits for it) and watches this Lua process: it exits by itself if the spec
-- process dies without calling stop().
local M = {}

local function script_dir()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) == "@" then
    local dir = src:sub(2):match("^(.*)/[^/]*$")
    if dir then return dir end
  end
  return "spec/support"
end

M.fixtures_dir = script_dir() .. "/../fixtures"
M.script = M.fixtures_dir .. "/mcp_server.mjs"

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function file_exists(path)
  local f = io.open(path, "r")
  if f then f:close() return true end
  return false
end

local function find_node()
  local p = io.popen("command -v node 2>/dev/null")
  if not p then return nil end
  local path = p:read("l")
  p:close()
  if path and path ~= "" then return path end
  return nil
end

-- Returns true, or false and the reason the fixture cannot run here.
function M.available()
  if not find_node() then
    return false, "node is not installed (run `make deps`)"
  end
  if not file_exists(M.fixtures_dir .. "/node_modules/@modelcontextprotocol/sdk/package.json") then
    return false, "spec/fixtures/node_modules is missing the MCP SDK (run `make deps` or `npm ci` in spec/fixtures)"
  end
  return true
end

local Server = {}
Server.__index = Server

-- True while pid is a live process (a zombie counts as gone: the server is
-- reparented to PID 1, which may reap it only later).
local function alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat", "r")
  if not f then return false end
  local line = f:read("l") or ""
  f:close()
  local state = line:match("%)%s+(%a)")
  return state ~= nil and state ~= "Z" and state ~= "X"
end

-- Stops the server (SIGTERM, then SIGKILL if it lingers). Safe to call twice.
function Server:stop()
  if self.stopped then return end
  self.stopped = true
  if self.pid and alive(self.pid) then
    os.execute("kill " .. self.pid .. " 2>/dev/null")
    for _ = 1, 40 do
      if not alive(self.pid) then break end
      os.execute("sleep 0.05")
    end
    if alive(self.pid) then os.execute("kill -9 " .. self.pid .. " 2>/dev/null") end
  end
  if self.pipe then
    pcall(self.pipe.close, self.pipe)
    self.pipe = nil
  end
end

local function seam_post(self, path, body)
  local core = require "sandbox.core"
  local async = require "sandbox.async"
  return async.await(function(resume)
    core.http_post{
      url = self.base .. path,
      headers = { "Content-Type: application/json" },
      body = body,
      allow_http = true,
      timeout_ms = 5000,
      on_done = resume,
    }
  end)
end

-- Inside an async task: queues one canned answer for /raw.
function Server:queue_raw(reply)
  local res = seam_post(self, "/__raw", require("cjson").encode(reply))
  if not res or not res.ok then error("mcp_server: queue_raw failed", 2) end
end

-- Inside an async task (lua/sandbox/async.lua): fetches POST /__log.
function Server:log()
  local res = seam_post(self, "/__log", "{}")
  if not res or not res.ok then
    return nil, "log request failed: " .. tostring(res and res.error)
  end
  local ok, decoded = pcall(require("cjson").decode, res.body)
  if not ok then return nil, "log is not JSON" end
  return decoded
end

-- opts.require_key: the server answers 401 unless Authorization is `Bearer <key>`.
-- opts.stateful: sessions with mcp-session-id (the SDK's stateful transport).
function M.start(opts)
  opts = opts or {}
  local ok, why = M.available()
  if not ok then error("mcp_server: " .. why, 2) end
  local args = {}
  if opts.require_key ~= nil then
    args[#args + 1] = "--require-key " .. shell_quote(opts.require_key)
  end
  if opts.sse then args[#args + 1] = "--sse" end
  if opts.stateful then args[#args + 1] = "--stateful" end
  local parent = require("spec_fs").own_pid()
  if parent then args[#args + 1] = "--parent-pid " .. parent end
  -- Backgrounded: the shell exits at once, so closing the pipe never blocks;
  -- node keeps the pipe's write end until it has printed its one line.
  -- LD_PRELOAD is dropped: the sanitizer suite preloads libasan for lua5.4 only.
  local cmd = string.format("cd %s && exec env -u LD_PRELOAD node mcp_server.mjs %s </dev/null &",
    shell_quote(M.fixtures_dir), table.concat(args, " "))
  local pipe = assert(io.popen(cmd, "r"))
  local line = pipe:read("l")
  if not line then
    pipe:close()
    error("mcp_server: the server printed nothing (see stderr)", 2)
  end
  local port = tonumber(line:match('"port"%s*:%s*(%d+)'))
  local pid = tonumber(line:match('"pid"%s*:%s*(%d+)'))
  if not port or not pid then
    pipe:close()
    error("mcp_server: unexpected first line: " .. line, 2)
  end
  local self = setmetatable({
    port = port,
    pid = pid,
    pipe = pipe,
    base = "http://127.0.0.1:" .. port,
    url = "http://127.0.0.1:" .. port .. "/mcp",
    raw_url = "http://127.0.0.1:" .. port .. "/raw",
    stopped = false,
  }, Server)
  return self
end

return M
