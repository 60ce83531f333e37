-- drivers/_seccomp.lua: a seccomp profile file as the drivers render it
-- (shared/spec/hardening.md 1): read once per path, checked to be a profile
-- Docker can load, kept as its compact JSON. The CLI driver passes
-- `--security-opt seccomp=<path>`, the Engine API driver SecurityOpt
-- "seccomp=<the JSON>" (what the docker CLI itself sends for that flag).
-- Which profile a mode uses, and where the shipped one lives, is the
-- runtime's (runtime/_seccomp.lua, which re-exports these).
--
--   seccomp.load(path)      -> {path=, json= (compact text), count=} (raises
--                              `seccomp profile missing: <path>` /
--                              `seccomp profile invalid: <path>`); cached per path
--   seccomp.count(profile)  -> how many system calls the decoded profile allows
--   seccomp.forget([path])  -> drops what load read (specs that rewrite a file)
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local M = {}

M.MAX_BYTES = 1048576

local cache = {}

local function fail(msg) error(msg, 0) end

-- The distinct system call names the profile allows (any allow rule).
function M.count(profile)
  local seen, n = {}, 0
  for _, rule in ipairs(profile.syscalls) do
    if rule.action == "SCMP_ACT_ALLOW" and json.kind(rule.names) == "array" then
      for _, name in ipairs(rule.names) do
        if type(name) == "string" and not seen[name] then
          seen[name] = true
          n = n + 1
        end
      end
    end
  end
  return n
end

-- A profile Docker can load: an object with a string defaultAction and an
-- array of syscall rules, each with an array of names and a string action.
local function well_formed(p)
  if json.kind(p) ~= "object" or type(p.defaultAction) ~= "string" or json.kind(p.syscalls) ~= "array" then
    return false
  end
  for _, rule in ipairs(p.syscalls) do
    if json.kind(rule) ~= "object" or json.kind(rule.names) ~= "array" or type(rule.action) ~= "string" then
      return false
    end
  end
  return true
end

function M.load(path)
  if type(path) ~= "string" or path:sub(1, 1) ~= "/" or path:find("[%z,\r\n]") then
    fail(errors.SECCOMP_MISSING .. tostring(path))
  end
  local hit = cache[path]
  if hit then return hit end
  local bytes = core.read_file_nofollow(path, M.MAX_BYTES)
  if not bytes then
    -- a link to the profile is the operator's own choice: follow it once
    local real = core.realpath(path)
    bytes = real and core.read_file_nofollow(real, M.MAX_BYTES)
  end
  if not bytes then fail(errors.SECCOMP_MISSING .. path) end
  local ok, profile = pcall(json.decode, bytes)
  if not ok or not well_formed(profile) then fail(errors.SECCOMP_INVALID .. path) end
  local compact = json.encode(profile)
  if not compact then fail(errors.SECCOMP_INVALID .. path) end
  hit = { path = path, json = compact, count = M.count(profile) }
  cache[path] = hit
  return hit
end

-- Forgets what load read (specs that rewrite a profile file).
function M.forget(path)
  if path then cache[path] = nil else cache = {} end
end

return M
