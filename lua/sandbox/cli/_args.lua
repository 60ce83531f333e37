-- cli/_args.lua: flag parsing shared by the sbx subcommands.
--   parse(args, spec) with spec = { flags = { socket = "value", force = "bool" } }
-- returns { flags = {...}, positional = {...} } or nil, message.
local errors = require "sandbox.errors"

local M = {}

function M.parse(args, spec)
  local out = { flags = {}, positional = {} }
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--" then
      table.move(args, i + 1, #args, #out.positional + 1, out.positional)
      break
    end
    local name, inline = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    if name and #out.positional == 0 or (name and spec.interleave) then
      local kind = spec.flags[name]
      if not kind then return nil, "unknown flag --" .. name end
      if kind == "bool" then
        out.flags[name] = true
      else
        local v = inline
        if v == nil then
          i = i + 1
          v = args[i]
        end
        if v == nil then return nil, "flag --" .. name .. " needs a value" end
        out.flags[name] = v
      end
    else
      out.positional[#out.positional + 1] = a
    end
    i = i + 1
  end
  return out
end

-- "ID[:NAME[:PRINCIPAL]]" -> {id, name, principalId}; the principal defaults
-- to the id, the name to the id.
function M.speaker(s)
  if type(s) ~= "string" or s == "" then return nil, "--speaker is required (ID[:NAME[:PRINCIPAL]])" end
  local id, rest = s:match("^([^:]*):?(.*)$")
  if id == "" then return nil, "--speaker needs a non-empty ID" end
  local name, principal = rest:match("^([^:]*):?(.*)$")
  if name == "" then name = id end
  if principal == "" then principal = id end
  return { id = id, name = name, principalId = principal }
end

-- Loads a config script (trusted operator Lua).
-- Any mode's config: path is run with `arg` (the Bun bridge's `options`,
-- `sbx doctor --options JSON`) as its argument. Returns the value and its
-- mode: "sealed" (sandbox{}), "rich" (sandbox.rich{}) or "precheck"
-- (sandbox.precheckScriptRunner{}); or nil, the reason and the mode whose
-- constructor refused (when known).
function M.load_any(path, arg)
  local sandbox = require "sandbox"
  if type(path) ~= "string" then return nil, "a CONFIG.lua path is required" end
  local chunk, err = loadfile(path, "t")
  if not chunk then return nil, errors.CONFIG_LOAD .. err end
  -- which constructor the script called, so a refusal's fix names that
  -- mode's options (a precheck runner has runRoot only)
  local runner, tried = sandbox.precheckScriptRunner, nil
  sandbox.precheckScriptRunner = function(...) tried = "precheck" return runner(...) end
  local ok, cfg = pcall(chunk, arg)
  sandbox.precheckScriptRunner = runner
  if not ok then return nil, "config " .. path .. " failed: " .. tostring(cfg), tried end
  if sandbox.rich.is_runtime(cfg) then return cfg, "rich" end
  if sandbox.precheck.facts(cfg) then return cfg, "precheck" end
  if type(cfg) == "table" and not sandbox.is_config(cfg) then
    ok, cfg = pcall(sandbox.new, cfg)
    if not ok then return nil, "config " .. path .. ": " .. tostring(cfg) end
  end
  if not sandbox.is_config(cfg) then
    return nil, "config " .. path .. " must return sandbox { ... }"
  end
  return cfg, "sealed"
end

-- A sealed config (sbx run, chat, broker, cleanup), or nil and the reason;
-- a rich or precheck config is refused with what to run instead.
function M.load_config(path)
  local cfg, mode = M.load_any(path)
  if not cfg then return nil, mode end
  if mode ~= "sealed" then
    return nil, "config " .. path .. " returns a " .. mode .. "-mode runtime, not sandbox { ... }: "
      .. "its host embeds it; check it with sbx doctor " .. path
  end
  return cfg
end

return M
