-- drivers/_rich.lua: the rich channel container (spec/rich-mode.md 5.3) and
-- its two Docker renderings: the Engine API create body (5.4, what the
-- Engine API driver sends) and the `docker create` argv of the CLI driver,
-- setting by setting the same container. Pure: no daemon, no process. The
-- 5.2 checks and the log configuration are rich mode's (rich/_container.lua);
-- this file renders a spec that passed them.
--
--   rich.render(spec, logcfg, how) -> {name=, image=, profile=, rendered=how(spec, logcfg)}
--   rich.body(spec, logcfg)   -> the JSON text of POST /containers/create
--   rich.argv(spec, logcfg, env_path) -> the argv of `docker create` (without
--                                the binary), its environment in the file env_path
--   rich.env_file(spec)       -> that file's text: the environment, one line each
--   rich.env(spec)            -> the worker's environment, in the page's order
--
-- spec: name, image, channel, profile, timeZone, labelChannel, labelProfile,
-- runDir, workspaceDir, uid, gid (5.1); logcfg: {Type=, Config={...}}.
-- The one setting the CLI cannot spell is the body's Config.NetworkDisabled:
-- both renderings give NetworkMode none (a network namespace of its own with
-- loopback only, no interface to anything else).
local errors = require "sandbox.errors"
local json = require "sandbox.json"

local M = {}

M.MEMORY = 1536 * 1024 * 1024
M.NANO_CPUS = 1000000000
M.PIDS = 256
M.NOFILE = 256
M.TMPFS = "rw,nosuid,nodev,size=512m,mode=1777"
M.BASE_URL = "http://127.0.0.1:8080/anthropic"
M.DUMMY_TOKEN = "sandbox-dummy-token"
M.CONTENT = "/app/worker/content.ts"
M.RESTART = "unless-stopped"

-- The worker's environment, in the page's order. No host secret, ever.
function M.env(spec)
  return json.array {
    "SANDBOX_PROFILE=" .. spec.profile, "TZ=" .. spec.timeZone, "ANTHROPIC_BASE_URL=" .. M.BASE_URL,
    "CLAUDE_CODE_OAUTH_TOKEN=" .. M.DUMMY_TOKEN, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
    "SANDBOX_CONTENT=" .. M.CONTENT, "HOME=/tmp/home", "PI_CODING_AGENT_DIR=/tmp/pi-agent",
    "CLAUDE_CONFIG_DIR=/workspace/claude",
  }
end

-- The two bind mounts of 5.3, as Docker's "src:dst[:ro]" strings.
local function binds(spec)
  return { spec.runDir .. ":/run/sandbox:ro", spec.workspaceDir .. ":/workspace" }
end

-- The log options' names, sorted (the body's and the argv's order).
local function log_names(logcfg)
  local names = {}
  for k in pairs(logcfg.Config) do names[#names + 1] = k end
  table.sort(names)
  return names
end

function M.body(spec, logcfg)
  local o = json.object
  local labels = o({ spec.labelChannel, spec.labelProfile },
    { [spec.labelChannel] = spec.channel, [spec.labelProfile] = spec.profile })
  local config = {}
  local names = log_names(logcfg)
  for _, k in ipairs(names) do config[k] = logcfg.Config[k] end
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
      -- the rich image's seccomp allow-list (rich/docker.lua loads it)
      SecurityOpt = json.array { "no-new-privileges", spec.seccomp and ("seccomp=" .. spec.seccomp.json) or nil },
      Binds = json.array(binds(spec)),
      RestartPolicy = o({ "Name" }, { Name = M.RESTART }),
      LogConfig = o({ "Type", "Config" }, { Type = logcfg.Type, Config = o(names, config) }),
    }),
  }))
end

-- `docker create` of the same container, flag for body field in the body's
-- order; --pull never as the Engine API's create never pulls. The
-- environment comes in the env file at env_path (M.env_file's text): the
-- CLI keeps an env file's order, not that of repeated --env flags, and 5.3
-- gives it in order. A label key
-- holding "=" cannot be spelled as `--label key=value` (the CLI splits at
-- the first "="): refused as an invalid specification, never mis-rendered.
function M.argv(spec, logcfg, env_path)
  if spec.labelChannel:find("=", 1, true) or spec.labelProfile:find("=", 1, true) then
    error(errors.RICH_SPEC, 0)
  end
  local argv = { "create", "--name", spec.name, "--pull", "never" }
  local function add(...)
    for _, v in ipairs { ... } do argv[#argv + 1] = v end
  end
  add("--user", string.format("%d:%d", spec.uid, spec.gid), "--env-file", env_path)
  add("--label", spec.labelChannel .. "=" .. spec.channel, "--label", spec.labelProfile .. "=" .. spec.profile)
  add("--network", "none",
    "--read-only",
    "--tmpfs", "/tmp:" .. M.TMPFS,
    "--memory", tostring(M.MEMORY),
    "--memory-swap", tostring(M.MEMORY),
    "--cpus", tostring(M.NANO_CPUS // 1000000000),
    "--pids-limit", tostring(M.PIDS),
    "--ulimit", string.format("nofile=%d:%d", M.NOFILE, M.NOFILE),
    "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges")
  if spec.seccomp then add("--security-opt", "seccomp=" .. spec.seccomp.path) end
  for _, b in ipairs(binds(spec)) do add("--volume", b) end
  add("--restart", M.RESTART, "--log-driver", logcfg.Type)
  for _, k in ipairs(log_names(logcfg)) do add("--log-opt", k .. "=" .. logcfg.Config[k]) end
  add(spec.image)
  return argv
end

-- The environment as the env file `docker create --env-file` reads: one
-- NAME=value a line, in order (no value holds CR or LF: the
-- profile and the time zone were checked, the rest are constants).
function M.env_file(spec)
  return table.concat(M.env(spec), "\n") .. "\n"
end

-- What the long-lived lifecycle compares (drivers/_lasting.lua) and the
-- rendering of one driver (`how`: M.body or M.argv), made before any call
-- to the daemon.
function M.render(spec, logcfg, how)
  return { name = spec.name, image = spec.image, profile = spec.profile, rendered = how(spec, logcfg) }
end

return M
