-- runtime/_seccomp.lua: the sealed container's seccomp profile
-- (shared/spec/hardening.md 1). The profile is the project's own allow-list,
-- worker/seccomp.json, shipped with the worker image's build context; the
-- runtime reads it once at startup and every container of the runtime runs
-- under it: the CLI driver passes `--security-opt seccomp=<absolute path>`,
-- the Engine API driver `SecurityOpt` "seccomp=<the JSON>" (what the docker
-- CLI itself sends for that flag). There is never a fallback to Docker's
-- default profile: a missing, unreadable or malformed profile fails startup.
--
--   seccomp.default_path()  -> the shipped profile beside this Lua tree
--                              (<checkout>/worker/seccomp.json), or nil
--   seccomp.load(path)      -> {path=, json= (compact text), count=} (raises
--                              `seccomp profile missing: <path>` /
--                              `seccomp profile invalid: <path>`); cached per path
--   seccomp.count(profile)  -> how many system calls the decoded profile allows
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local M = {}

M.FILE = "seccomp.json"
M.MAX_BYTES = 1048576

local cache = {}

local function fail(msg) error(msg, 0) end

-- The directory holding sandbox/ (this file is sandbox/runtime/_seccomp.lua).
local function tree()
  local src = debug.getinfo(1, "S").source
  local dir = src:match("^@(.*)/sandbox/runtime/_seccomp%.lua$")
  if dir == nil then return nil end
  if dir == "" then dir = "." end
  return core.realpath(dir) or dir
end

local function exists(path)
  local st = core.fs_stat(path)
  return st ~= nil and st.type == "file"
end

-- A checkout keeps the profile in <root>/worker/; an installed tree
-- (<prefix>/share/lua/5.4) beside the image context in
-- <prefix>/share/pi-roundtable-sandbox/; the Bun package in <pkg>/worker/.
function M.default_path()
  local t = tree()
  if not t then return nil end
  local parent = t:match("^(.*)/[^/]+$") or "."
  local candidates = { parent .. "/worker/" .. M.FILE }
  local share = t:match("^(.*)/lua/5%.4$")
  if share then candidates[#candidates + 1] = share .. "/pi-roundtable-sandbox/" .. M.FILE end
  for _, p in ipairs(candidates) do
    if exists(p) then return p end
  end
  return candidates[1]
end

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
