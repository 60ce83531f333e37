-- ops/metrics_listen.lua: the `metricsListen` option (spec/operations.md 4):
-- the engine serves its metrics on GET /metrics itself, on its own libuv
-- loop, through the core's loopback HTTP server (core.http_server: framed
-- by http_parser, bounded head, no body, a whole-connection deadline, at
-- most 64 connections). Loopback only: the value is "127.x.y.z:PORT" (an
-- address of 127.0.0.0/8) or "[::1]:PORT"; anything else (a name, 0.0.0.0,
-- a LAN address, a missing port) is refused at construction with
-- `metricsListen must be a loopback address and port`. Port 0 picks a free
-- port (rt:metrics_address() says which). A Prometheus on another host
-- scrapes through something the operator runs on this one (a reverse proxy
-- with its own access control), never through a public bind of the engine.
--
--   local ml = require "sandbox.ops.metrics_listen"
--   ml.check(value)                 -- raises errors.METRICS_LISTEN (nil is fine: not served)
--   local srv = ml.serve(value, render[, ready])   -- render() -> exposition text;
--                                   ready() -> ok, text (may yield); raises METRICS_START
--   srv:port(), srv:host(), srv:close()
--
-- Requests: GET /metrics -> 200 with the text exposition (version 0.0.4);
-- GET /healthz -> 200 "ok" while the process serves its loop (liveness);
-- GET /readyz -> 200 or 503 with one line per readiness check
-- (ops/health.lua: daemon, image, writable roots, descriptor room), 404
-- when no ready() was given; any other target (a query string too) -> 404;
-- another method -> 405; a body -> 413; a head over MAX_HEAD -> 431; a
-- request not complete within TIMEOUT_MS -> 408. None of them touches a
-- channel.
local async = require "sandbox.async"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local exposition = require "sandbox.ops.exposition"

local M = {}

M.PATH = "/metrics"
M.HEALTH_PATH = "/healthz"
M.READY_PATH = "/readyz"
local PLAIN = "text/plain; charset=utf-8"
M.MAX_HEAD = 8192
M.TIMEOUT_MS = 10000

local function fail(msg) error(msg, 0) end

-- value -> host (for core.http_server), port; or nil.
function M.parse(value)
  if type(value) ~= "string" or #value > 64 then return nil end
  local host, port = value:match("^%[([^%]]+)%]:(%d+)$")
  if not host then host, port = value:match("^([%d%.]+):(%d+)$") end
  if not host or #port > 5 then return nil end
  port = tonumber(port)
  if port > 65535 then return nil end
  local canon, family = core.addr_parse(host)
  if canon == nil then return nil end
  if family == 4 and not canon:find("^127%.") then return nil end
  if family == 6 and (canon ~= "::1" or not value:find("^%[")) then return nil end
  return canon, math.tointeger(port)
end

function M.check(value)
  if value ~= nil and M.parse(value) == nil then fail(errors.METRICS_LISTEN) end
end

-- Starts serving render()'s text on the address of value. Raises the
-- catalogue's METRICS_START with the listener's error (EADDRINUSE, ...).
function M.serve(value, render, ready)
  local host, port = M.parse(value)
  if host == nil then fail(errors.METRICS_LISTEN) end
  local routes = { [M.PATH] = true, [M.HEALTH_PATH] = true, [M.READY_PATH] = ready ~= nil }
  local srv, err = core.http_server {
    host = host, port = port, max_head = M.MAX_HEAD, max_body = 0, timeout_ms = M.TIMEOUT_MS,
    on_request = function(req)
      if not routes[req.target] then return req:reply(404, "not found\n", PLAIN) end
      if req.method ~= "GET" then return req:reply(405, "method not allowed\n", PLAIN) end
      if req.target == M.HEALTH_PATH then return req:reply(200, "ok\n", PLAIN) end
      if req.target == M.READY_PATH then
        async.spawn(function()
          local ok, is_ready, text = pcall(ready)
          req:reply(ok and is_ready and 200 or 503, ok and text or "FAIL readiness check failed\n", PLAIN)
        end)
        return
      end
      req:reply(200, render(), exposition.CONTENT_TYPE)
    end,
  }
  if not srv then fail(errors.METRICS_START .. tostring(err)) end
  return srv
end

return M
