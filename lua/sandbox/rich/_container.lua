-- rich/_container.lua: the long-lived channel container's specification
-- (spec/rich-mode.md 5.2 checks, 5.3 settings): what any rich driver is
-- handed (5.1's spec) and the Engine API create body the built-in Docker
-- driver sends. Pure: no daemon call.
--
--   container.check(spec, log) -> the checked log config {Type, Config}   (raises 5.2's errors)
--   container.create_body(spec, logcfg, seccomp_opt) -> JSON text of POST /containers/create
--     (seccomp_opt: "seccomp=<profile JSON>", SecurityOpt's second entry)
--   container.log_tag(channel) -> "sandbox/<channel>" with [^A-Za-z0-9_.:/-] as "_"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local runtime_options = require "sandbox.runtime._options"

local M = {}

M.MEMORY = 1536 * 1024 * 1024
M.NANO_CPUS = 1000000000
M.PIDS = 256
M.NOFILE = 256
M.TMPFS = "rw,nosuid,nodev,size=512m,mode=1777"
M.BASE_URL = "http://127.0.0.1:8080/anthropic"
M.DUMMY_TOKEN = "sandbox-dummy-token"
M.CONTENT = "/app/worker/content.ts"
M.LOG_NAME = "^[a-z0-9][a-z0-9_.-]*$"     -- 1-64

local function fail(msg) error(msg, 0) end

function M.log_tag(channel)
  local out = {}
  for _, cp in utf8.codes(channel) do
    local c = cp < 128 and string.char(cp) or ""
    out[#out + 1] = c:find("^[A-Za-z0-9_.:/-]$") and c or "_"
  end
  return "sandbox/" .. table.concat(out)
end

local function log_name_ok(s) return type(s) == "string" and #s <= 64 and s:find(M.LOG_NAME) ~= nil end

local function mount_ok(p)
  return type(p) == "string" and p:sub(1, 1) == "/" and not p:find("^/+$") and not p:find("[:,\r\n%z]")
end

-- The log config of a spec: spec.log, else the driver's log option (a table
-- or a function of the channel), else journald tagged with the channel.
function M.log_config(spec, option)
  local l = spec.log
  if l == nil then
    l = option
    if type(l) == "function" then l = l(spec.channel) end
  end
  if l == nil then
    return { Type = "journald", Config = { tag = M.log_tag(spec.channel) } }
  end
  if type(l) ~= "table" or not log_name_ok(l.driver) then fail(errors.RICH_LOG_DRIVER) end
  local config = {}
  if l.options ~= nil then
    if type(l.options) ~= "table" then fail(errors.RICH_LOG_DRIVER) end
    for k, v in pairs(l.options) do
      if not log_name_ok(k) or type(v) ~= "string" or v:find("[\r\n]") then fail(errors.RICH_LOG_DRIVER) end
      config[k] = v
    end
  end
  return { Type = l.driver, Config = config }
end

function M.name_ok(name)
  return type(name) == "string" and #name <= 91 and name:find("^[a-z0-9][a-z0-9_.-]*$") ~= nil
end

-- 5.2, in the table's order; returns the log config.
function M.check(spec, log_option)
  if type(spec) ~= "table" then fail(errors.RICH_SPEC) end
  local img = spec.image
  if not M.name_ok(spec.name)
      or type(spec.profile) ~= "string" or #spec.profile > 100 or not spec.profile:find("^[a-zA-Z0-9_-]+$")
      or type(img) ~= "string" or img == "" or img:find("%s") or img:sub(1, 1) == "-" then
    fail(errors.RICH_SPEC)
  end
  if math.type(spec.uid) ~= "integer" or math.type(spec.gid) ~= "integer" or spec.uid <= 0 or spec.gid <= 0 then
    fail(errors.RICH_WORKER_ROOT)
  end
  if not mount_ok(spec.runDir) or not mount_ok(spec.workspaceDir) then fail(errors.RICH_MOUNT) end
  if not runtime_options.time_zone_ok(spec.timeZone) then fail(errors.RICH_TIME_ZONE) end
  if type(spec.channel) ~= "string" or not utf8.len(spec.channel) then fail(errors.RICH_SPEC) end
  for _, k in ipairs { "labelChannel", "labelProfile" } do
    if type(spec[k]) ~= "string" or spec[k] == "" then fail(errors.RICH_SPEC) end
  end
  return M.log_config(spec, log_option)
end

-- The worker's environment, in the page's order. No host secret, ever.
function M.env(spec)
  return json.array {
    "SANDBOX_PROFILE=" .. spec.profile, "TZ=" .. spec.timeZone, "ANTHROPIC_BASE_URL=" .. M.BASE_URL,
    "CLAUDE_CODE_OAUTH_TOKEN=" .. M.DUMMY_TOKEN, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
    "SANDBOX_CONTENT=" .. M.CONTENT, "HOME=/tmp/home", "PI_CODING_AGENT_DIR=/tmp/pi-agent",
    "CLAUDE_CONFIG_DIR=/workspace/claude",
  }
end

function M.create_body(spec, logcfg, seccomp_opt)
  local o = json.object
  local labels = o({ spec.labelChannel, spec.labelProfile },
    { [spec.labelChannel] = spec.channel, [spec.labelProfile] = spec.profile })
  local config = {}
  local names = {}
  for k, v in pairs(logcfg.Config) do names[#names + 1] = k config[k] = v end
  table.sort(names)
  return json.encode(o({ "Image", "User", "Env", "Labels", "NetworkDisabled", "HostConfig" }, {
    Image = spec.image,
    User = string.format("%d:%d", spec.uid, spec.gid),
    Env = M.env(spec),
    Labels = labels,
    NetworkDisabled = true,
    HostConfig = o({ "NetworkMode", "ReadonlyRootfs", "Tmpfs", "Memory", "MemorySwap", "NanoCpus",
      "PidsLimit", "Ulimits", "CapDrop", "SecurityOpt", "Binds", "RestartPolicy", "LogConfig" }, {
      NetworkMode = "none",
      ReadonlyRootfs = true,
      Tmpfs = o({ "/tmp" }, { ["/tmp"] = M.TMPFS }),
      Memory = M.MEMORY,
      MemorySwap = M.MEMORY,
      NanoCpus = M.NANO_CPUS,
      PidsLimit = M.PIDS,
      Ulimits = json.array { o({ "Name", "Soft", "Hard" }, { Name = "nofile", Soft = M.NOFILE, Hard = M.NOFILE }) },
      CapDrop = json.array { "ALL" },
      SecurityOpt = json.array { "no-new-privileges", seccomp_opt },
      Binds = json.array { spec.runDir .. ":/run/sandbox:ro", spec.workspaceDir .. ":/workspace" },
      RestartPolicy = o({ "Name" }, { Name = "unless-stopped" }),
      LogConfig = o({ "Type", "Config" }, { Type = logcfg.Type, Config = o(names, config) }),
    }),
  }))
end

return M
