-- embed/_precheck.lua: the precheck script runner (lua/sandbox/precheck) for
-- an embedding host (the Bun bridge's precheckScriptRunner). The operator's
-- trusted Lua config script builds the runner (grant, token and toolName are
-- Lua functions there); the host reaches describe, run and toolName through
-- these requests. Registered by embed/_utilities.lua.
--
--   {"type":"precheck.new","owner":O,"config":PATH,"options":{...}}
--       runs the config script with `options` as its argument; it must
--       return sandbox.precheckScriptRunner{...}; value {"timeoutMs":N}
--       (absent when the option is not set)
--   {"type":"precheck.describe","owner":O,"scope":{channel,target,tier}} -> text
--   {"type":"precheck.run","owner":O,"script":S,"context":{...}} -> the
--       result (null for none); the request's cancel aborts ctx.signal, and
--       so does the engine's stop
--   {"type":"precheck.toolName","owner":O,"server":S,"tool":T} -> name
--   {"type":"precheck.dispose","owner":O} -> true (runs in flight finish)
local errors = require "sandbox.errors"

local M = {}

local METHODS = { "describe", "run", "toolName" }

local function runners(self)
  self.prechecks = self.prechecks or {}
  return self.prechecks
end

local function load_runner(path, options)
  if type(path) ~= "string" or path == "" then error(errors.EMBED_REQUEST .. "config must be a non-empty string", 0) end
  local chunk, lerr = loadfile(path, "t")
  if not chunk then error(errors.CONFIG_LOAD .. tostring(lerr), 0) end
  local ok, runner = pcall(chunk, options or {})
  if not ok then error(runner, 0) end
  local fine = type(runner) == "table"
  for _, m in ipairs(METHODS) do fine = fine and type(runner[m]) == "function" end
  if not fine then error("config " .. path .. " must return sandbox.precheckScriptRunner { ... }", 0) end
  return runner
end

function M.register(H, U, util)
  local function the_runner(self, req)
    local r = runners(self)[util.need_owner(req)]
    if r == nil then error(errors.EMBED_REQUEST .. "no precheck runner " .. req.owner, 0) end
    return r
  end

  H["precheck.new"] = function(self, _, req)
    local owner = util.need_owner(req)
    if runners(self)[owner] ~= nil then error(errors.EMBED_REQUEST .. "precheck runner " .. owner .. " exists", 0) end
    local runner = load_runner(req.config, req.options)
    runners(self)[owner] = runner
    return { timeoutMs = runner.timeoutMs }
  end

  H["precheck.describe"] = function(self, _, req)
    return the_runner(self, req).describe(req.scope)
  end

  H["precheck.run"] = function(self, rid, req)
    local runner = the_runner(self, req)
    local context = type(req.context) == "table" and req.context or {}
    context.signal = util.request_signal(self, rid)
    return runner.run(req.script, context)
  end

  H["precheck.toolName"] = function(self, _, req)
    return the_runner(self, req).toolName(req.server, req.tool)
  end

  -- the runner's Prometheus text: its runs as sbx_turns_total{mode="precheck",...}
  H["precheck.metrics"] = function(self, _, req)
    local r = the_runner(self, req)
    if type(r.metrics) ~= "function" then error(errors.EMBED_REQUEST .. "this precheck runner has no metrics", 0) end
    return r.metrics()
  end

  H["precheck.dispose"] = function(self, _, req)
    runners(self)[util.need_owner(req)] = nil
    return true
  end

  for _, k in ipairs { "precheck.new", "precheck.describe", "precheck.run", "precheck.toolName", "precheck.metrics",
      "precheck.dispose" } do
    U[k] = true
  end
end

return M
