-- embed/_research.lua: the research worker (lua/sandbox/delegator/research.lua) for an
-- embedding host (the Bun bridge's SandboxResearchWorker). The worker runs
-- here; every host function it needs (the model runtime, search,
-- extractFetched, fetchContent, extension factories and their tools and
-- guards) is a host call (embed.lua Engine:host_call) to the owner the host
-- named. Registered by embed_utilities.lua.
--
--   {"type":"research.check","options":{...},"fns":{...},"factories":[...]}
--       builds a worker and drops it: value true, or the constructor's error
--   {"type":"research.run","owner":O,"task":T,"options":{...},"fns":{...},"factories":[...]}
--       one run with a fresh worker; value: the report; the request's
--       cancel aborts the run's signal
-- options: agentDir, workDir, model, thinking, aborted, tools = {
-- extensionPaths, toolNames, prompt } (JSON). fns: for modelRuntime, search,
-- extractFetched, fetchContent and scope, true when the host has that
-- function, or the JSON value the host gave instead (so the constructor's
-- type check refuses it). factories: per tools.extensionFactories entry, true
-- for a function, false otherwise. scope is applied by the host around the
-- whole request, so here it runs its function at once.
--
-- Host calls of a run (fn, args):
--   findModel [model]              -> a handle (any JSON) or null
--   complete [handle, request]     -> the assistant message (signal: the call's)
--   search [query], fetchContent [url] -> text (signal)
--   extractFetched [result]        -> text; result is the safe fetch result
--                                     with "dataBase64" (signal)
--   extension.load [i]             -> {"load":L,"tools":[{name,description,parameters}],"guard":b}
--   extension.execute [L, name, args] -> text (signal)
--   extension.toolCall [L, event]  -> {"block":b,"reason":...} or null
local research = require "sandbox.delegator.research"

local M = {}

-- embed_utilities.lua's helpers, given to register(): request_signal,
-- finishing, result_json, need_owner.
local util

local function proxy_factory(self, owner, i, fin)
  return function(api)
    local spec = self:host_call(owner, "extension.load", { i }, nil, fin)
    if type(spec) ~= "table" then error("research extension " .. i .. " did not load", 0) end
    for _, t in ipairs(type(spec.tools) == "table" and spec.tools or {}) do
      local name = t.name
      api.register_tool {
        name = name, description = t.description, parameters = t.parameters,
        execute = function(args, signal)
          return self:host_call(owner, "extension.execute", { spec.load, name, args }, signal, fin)
        end,
      }
    end
    if spec.guard then
      api.on("tool_call", function(event)
        return self:host_call(owner, "extension.toolCall", { spec.load, event }, nil, fin)
      end)
    end
  end
end

-- The research.new options of a request; owner receives the host calls.
-- fin: the request's finishing signal (embed_utilities.lua), the scope of
-- every host call.
local function options(self, owner, req, fin)
  local o = type(req.options) == "table" and req.options or {}
  local f = type(req.fns) == "table" and req.fns or {}
  local opts = {
    agentDir = o.agentDir, workDir = o.workDir, model = o.model, thinking = o.thinking, aborted = o.aborted,
  }
  if f.modelRuntime == true then
    opts.modelRuntime = {
      find_model = function(_, model) return self:host_call(owner, "findModel", { model }, nil, fin) end,
      complete = function(_, handle, request, signal)
        return self:host_call(owner, "complete", { handle, request }, signal, fin)
      end,
    }
  else
    opts.modelRuntime = f.modelRuntime
  end
  for _, k in ipairs { "search", "fetchContent" } do
    if f[k] == true then
      opts[k] = function(arg, signal) return self:host_call(owner, k, { arg }, signal, fin) end
    else
      opts[k] = f[k]
    end
  end
  if f.extractFetched == true then
    opts.extractFetched = function(result, signal)
      return self:host_call(owner, "extractFetched", { util.result_json(result) }, signal, fin)
    end
  else
    opts.extractFetched = f.extractFetched
  end
  if f.scope == true then
    opts.scope = function(fn) return fn() end
  else
    opts.scope = f.scope
  end
  if o.tools ~= nil then
    local t = o.tools
    if type(t) == "table" then
      t = { extensionPaths = t.extensionPaths, toolNames = t.toolNames, prompt = t.prompt }
      if type(req.factories) == "table" then
        local list = {}
        for i, isfn in ipairs(req.factories) do
          list[i] = isfn == true and proxy_factory(self, owner, i, fin) or false
        end
        t.extensionFactories = list
      elseif req.factories ~= nil then
        t.extensionFactories = req.factories
      end
    end
    opts.tools = t
  end
  return opts
end

function M.register(H, U, helpers)
  util = helpers
  local request_signal, finishing = helpers.request_signal, helpers.finishing
  H["research.check"] = function(self, _, req)
    research.new(options(self, "check", req, nil))
    return true
  end

  H["research.run"] = finishing(function(self, rid, req, fin)
    local worker = research.new(options(self, util.need_owner(req), req, fin))
    return worker:run(req.task, request_signal(self, rid))
  end)

  U["research.check"], U["research.run"] = true, true
end

return M
