-- docker/fd_starvation.lua: the descriptor starvation of the hostile review
-- (shared/spec/hardening.md 2, behaviour 2), run by hostile_spec.lua in a
-- child process whose RLIMIT_NOFILE is 120 (soft and hard):
--
--   lua5.4 fd_starvation.lua ROOT WORKER_IMAGE HOSTILE_IMAGE
--
-- Six hostile channels each run a container that holds 16 connections to
-- its broker (attack.c connections); meanwhile eight bystander turns run one
-- after another on the real worker against a fake model on loopback. Then
-- the hostile turns are stopped, and one hostile channel runs a real turn
-- (recovery without an operator). Prints one JSON line: {bystanders = [the
-- reply text, or the failure reason or error, ...], pooled = the pool in use
-- during the attack, hostile = how the hostile turns ended (their reasons),
-- recovered = the reply text, leftovers = entries left in runRoot, limit =
-- the descriptor limit}.
package.path = "lua/?.lua;lua/?/init.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/lua/?.so;" .. package.cpath
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"
local runtime = require "sandbox.runtime"

local function quiet() end

local root, worker_image, hostile_image = arg[1], arg[2], arg[3]
local KEY = "fd-starvation-key"
local SPEAKER = { id = "guest", name = "Guest", principalId = "p_guest" }

local server = assert(core.http_server {
  on_request = function(req)
    if req.headers.authorization ~= "Bearer " .. KEY then return req:reply(401, "{}") end
    req:reply(200, json.encode { choices = json.array { { message = { role = "assistant", content = "bystander ok" } } } })
  end,
})

local cli = require("sandbox.drivers.cli") { binary = "docker" }
local driver = {
  run = function(_, spec, turn, signal, report)
    if turn.text == "HOLD" then spec.image = hostile_image end
    return cli:run(spec, turn, signal, report)
  end,
  list = function(_, ...) return cli:list(...) end,
  remove = function(_, ...) return cli:remove(...) end,
}

local result = { bystanders = {}, hostile = {}, limit = core.fd_budget().limit }
async.run(function()
  local rt = runtime.new {
    image = worker_image, runRoot = root .. "/run", workspaceRoot = root .. "/work",
    model = "fake-model", modelUrl = server:url("/v1/chat/completions"), allowHttp = true,
    apiKey = function() return KEY end, driver = driver, turnTimeoutMs = 120000,
    logger = { info = quiet, warn = quiet, error = quiet },
    runtime = require("docker_runtime").name,
  }
  local hostile = {}
  for i = 1, 6 do
    hostile[i] = async.spawn(function() return pcall(rt.run_turn, rt, "fake:hostile" .. i, SPEAKER, "HOLD") end)
  end
  -- wait until every hostile container holds its broker connections
  for _ = 1, 600 do
    if #rt:busy() == 6 and core.fd_budget().pool_used > 0 then break end
    async.sleep(50)
  end
  async.sleep(3000)
  result.pooled = core.fd_budget().pool_used
  -- a turn's outcome: the reply text, else its failure reason (run_turn's
  -- result), else the error of a turn that never started
  local function outcome(ok, r)
    if not ok then return tostring(r) end
    return r.ok and r.text or r.reason
  end
  for i = 1, 8 do
    result.bystanders[i] = outcome(pcall(rt.run_turn, rt, "fake:bystander" .. i, SPEAKER, "Hello"))
  end
  for i = 1, 6 do rt:stop("fake:hostile" .. i) end
  for i = 1, 6 do
    local _, ok, r = async.wait(hostile[i])
    result.hostile[i] = outcome(ok, r)
  end
  result.recovered = outcome(pcall(rt.run_turn, rt, "fake:hostile1", SPEAKER, "Hello"))
  result.leftovers = #(core.fs_readdir(root .. "/run") or {})
  result.installation = rt.installation
  rt:dispose()
end)
server:close()
print(json.encode(result))
