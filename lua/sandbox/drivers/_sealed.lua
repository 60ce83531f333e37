-- drivers/_sealed.lua: what one sealed container is, as data (spec/runtime.md
-- 4.2-4.4), and its two Docker renderings: the `docker run` argv of the CLI
-- driver and the Engine API create body, for the sealed turns and the
-- precheck runs alike. Pure: no daemon, no process; the only system calls
-- are realpath on the two mount sources, the seccomp profile's one read
-- (drivers/_seccomp.lua) and the OS random source for names. It requires
-- nothing of sandbox.runtime (the drivers sit below the runtime; the
-- runtime, precheck, the sweep and the CLI require it from here).
--
--   container.args(spec)        -> argv for `docker` (43 elements + image;
--                                  41 without a seccomp profile; 2 more with
--                                  a runtime), after the 4.2 validation
--                                  (exact errors)
--   container.check(spec)       -> the validated spec with canonical mount
--                                  sources and formatted numbers (raises)
--   container.engine_body(spec) -> the Engine API create body (JSON text) of
--                                  the same container (4.3 table)
--   container.argv(c) / container.body(c) -> the same two from an already
--                                  checked spec c (the driver contract checks once)
--   container.name(segment)     -> roundtable-sandbox-<16 hex>-<8 random hex>
--   container.name_valid(name)  -> the 4.4 name rule
--   container.labels(installation, owner) -> the two labels of 4.4
--   container.turn(t)           -> the turn object of 8.2 and its compact JSON
--   container.turn_json(turn)   -> the JSON alone (the stdin bytes a driver writes)
--
-- This file is the one owner of a sealed container's identity (name, labels)
-- and of the turn's bytes: the runtime, the drivers, the sweep, `sbx cleanup`,
-- `sbx doctor` and `sbx demo` all read them here.
--
-- spec = {name, image, runDir, workspaceDir, uid, gid, memoryMb, cpus, pids,
-- labels, seccompProfile}; seccompProfile is the absolute path of the
-- seccomp profile (shared/spec/hardening.md 1, drivers/_seccomp.lua): the
-- argv gains `--security-opt seccomp=<path>` right after no-new-privileges,
-- the Engine API body "seccomp=<its JSON>" in SecurityOpt (a sealed runtime
-- always sets it; without it Docker's default profile applies).
-- runtime is nil (the daemon's default runtime) or the name of a runtime
-- the daemon has registered (shared/spec/warm-turns.md 2, 4: `runsc` for
-- gVisor, `crun`), matching ^[a-z][a-z0-9_.-]{0,63}$ (else `invalid
-- container runtime`): the argv gains `--runtime <name>` right after
-- `--env HOME=/tmp/home` (before an entrypoint and the image, so every
-- index of the 4.3 table stays), the Engine API body HostConfig.Runtime.
-- labels = {[LABEL_INSTALLATION]=..., [LABEL_OWNER]=...}. A label
-- missing from `labels` is rendered with an empty value (the runtime's
-- construction dry run passes none); the driver refuses to run without both.
-- The precheck runner's containers (shared/spec/precheck.md 6.1) add three
-- fields: labels = false (no --label at all), workspaceReadOnly = true (the
-- workspace mount gains `readonly`) and entrypoint = {path, args...}
-- (`--entrypoint <path>` after --env, the args after the image). A dry run
-- sets canonical = true: the mount sources are taken as already canonical
-- (they need not exist yet) instead of being resolved with realpath.
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local seccomp = require "sandbox.drivers._seccomp"

local M = {}

M.E_NAME_IMAGE = errors.NAME_IMAGE
M.E_NON_ROOT = errors.NON_ROOT
M.E_MOUNT_PATH = errors.MOUNT_PATH
M.E_MOUNT_SEPARATE = errors.MOUNT_SEPARATE
M.E_LIMITS = errors.LIMITS
M.E_LABELS = errors.LABELS
M.E_ENTRYPOINT = errors.ENTRYPOINT
M.E_RUNTIME = errors.RUNTIME

M.LABEL_INSTALLATION = "roundtable.sandbox.installation"
M.LABEL_OWNER = "roundtable.sandbox.owner"
M.NAME_PATTERN = "^roundtable%-sandbox%-%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%-%x%x%x%x%x%x%x%x$"
M.TMPFS = "/tmp:rw,noexec,nosuid,nodev,size=64m,mode=1777"
M.ENV = "HOME=/tmp/home"
M.ARGC = 44              -- with the seccomp profile (42 without)

local function fail(msg) error(msg, 0) end

local INT64_MAX = math.maxinteger

-- "Integer" (spec 1): a Lua integer or a float with an exact integral value.
local function as_integer(v)
  if math.type(v) == "integer" then return v end
  if math.type(v) == "float" and v == math.floor(v) and v >= -2 ^ 63 and v < 2 ^ 63 then
    return math.tointeger(v)
  end
  return nil
end
M.as_integer = as_integer

-- True for a name matching ^[a-z0-9][a-z0-9_.-]{0,90}$.
local function name_ok(name)
  return type(name) == "string" and #name >= 1 and #name <= 91
    and name:find("^[a-z0-9][a-z0-9_.%-]*$") ~= nil
end

-- Non-empty printable ASCII without spaces, not starting with '-'.
local function image_ok(image)
  return type(image) == "string" and image ~= "" and image:sub(1, 1) ~= "-"
    and not image:find("[^\33-\126]")
end

-- The image rule of 4.2 alone (sbx doctor, before the roots exist).
function M.check_image(image)
  if not image_ok(image) then fail(M.E_NAME_IMAGE) end
end

local function mount_path_ok(p)
  return type(p) == "string" and p:sub(1, 1) == "/" and p ~= "/" and not p:find("[,\n\r%z]")
end

local function inside(a, b)   -- a equal to b, or under it
  return a == b or a:sub(1, #b + 1) == b .. "/"
end

-- The shortest decimal text that reads back as x (x > 0, finite).
local function shortest(x)
  for p = 1, 17 do
    local s = string.format("%." .. p .. "g", x)
    if tonumber(s) == x then return s end
  end
  return string.format("%.17g", x)
end

-- cpus -> plain decimal text (no exponent, no trailing zeros) and the exact
-- NanoCpus integer, or nil when outside spec 2.3 (finite, > 0, at most nine
-- decimal places, cpus x 10^9 within a signed 64-bit integer).
function M.format_cpus(cpus)
  if type(cpus) ~= "number" or cpus ~= cpus or cpus <= 0 or cpus == math.huge then return nil end
  local int, frac
  if math.type(cpus) == "integer" then
    int, frac = tostring(cpus), ""
  else
    local s = shortest(cpus)
    local mant, exp = s:match("^([%d.]+)e([-+]%d+)$")
    mant, exp = mant or s, tonumber(exp or 0)
    local ip, fp = mant:match("^(%d*)%.?(%d*)$")
    local digits = ip .. fp
    local point = #ip + exp
    if point <= 0 then
      int, frac = "0", string.rep("0", -point) .. digits
    elseif point >= #digits then
      int, frac = digits .. string.rep("0", point - #digits), ""
    else
      int, frac = digits:sub(1, point), digits:sub(point + 1)
    end
    int = int:gsub("^0+", "")
    if int == "" then int = "0" end
    frac = frac:gsub("0+$", "")
  end
  if #frac > 9 then return nil end
  local nano_text = (int .. frac .. string.rep("0", 9 - #frac)):gsub("^0+", "")
  if nano_text == "" then return nil end
  local max = tostring(INT64_MAX)
  if #nano_text > #max or (#nano_text == #max and nano_text > max) then return nil end
  local text = frac == "" and int or (int .. "." .. frac)
  return text, math.tointeger(tonumber(nano_text))
end

-- A non-empty list of non-empty strings, none starting with '-' or holding
-- NUL, CR or LF.
local function entrypoint_ok(ep)
  if type(ep) ~= "table" or #ep == 0 then return false end
  local n = 0
  for _ in pairs(ep) do n = n + 1 end
  if n ~= #ep then return false end
  for _, part in ipairs(ep) do
    if type(part) ~= "string" or part == "" or part:sub(1, 1) == "-" or part:find("[%z\r\n]") then
      return false
    end
  end
  return true
end
M.entrypoint_ok = entrypoint_ok

-- The runtime rule of shared/spec/warm-turns.md 2: nil (the daemon's
-- default), or a name matching ^[a-z][a-z0-9_.-]{0,63}$.
function M.runtime_ok(name)
  return name == nil or (type(name) == "string" and #name <= 64 and name:find("^[a-z][a-z0-9_.%-]*$") ~= nil)
end

local function label_ok(v)
  return v == nil or (type(v) == "string" and #v <= 256 and not v:find("[^\33-\126]"))
end

-- Validates a spec (4.2, in the table's order) and returns a new table with
-- canonical mount sources and the formatted numbers:
-- {name, image, runDir, workspaceDir, uid, gid, memoryMb, cpus (text),
--  nanoCpus, pids, installation, owner, labelled, workspaceReadOnly,
--  entrypoint, runtime, seccomp = the loaded profile {path, json, count}
--  or nil}.
-- A seccompProfile that cannot be read raises the startup error of
-- drivers/_seccomp.lua (the runtime loaded it at construction already).
function M.check(spec)
  if type(spec) ~= "table" then fail(M.E_NAME_IMAGE) end
  if not name_ok(spec.name) or not image_ok(spec.image) then fail(M.E_NAME_IMAGE) end
  if spec.entrypoint ~= nil and not entrypoint_ok(spec.entrypoint) then fail(M.E_ENTRYPOINT) end
  local uid, gid = as_integer(spec.uid), as_integer(spec.gid)
  if not uid or uid <= 0 or not gid or gid <= 0 then fail(M.E_NON_ROOT) end
  if not mount_path_ok(spec.runDir) or not mount_path_ok(spec.workspaceDir) then fail(M.E_MOUNT_PATH) end
  -- Canonicalise, so an operator-side symlink cannot redirect a mount; the
  -- canonical form must pass the same rules (a link to "/" or a comma path).
  local run_dir, ws_dir = spec.runDir, spec.workspaceDir
  if spec.canonical ~= true then
    run_dir, ws_dir = core.realpath(spec.runDir), core.realpath(spec.workspaceDir)
  end
  if not mount_path_ok(run_dir) or not mount_path_ok(ws_dir) then fail(M.E_MOUNT_PATH) end
  if inside(run_dir, ws_dir) or inside(ws_dir, run_dir) then fail(M.E_MOUNT_SEPARATE) end
  local mem, pids = as_integer(spec.memoryMb), as_integer(spec.pids)
  local cpus, nano = M.format_cpus(spec.cpus)
  if not mem or mem < 64 or mem > INT64_MAX // 1048576 or not pids or pids < 8 or not cpus then
    fail(M.E_LIMITS)
  end
  local labels = spec.labels
  local labelled = labels ~= false
  if labels == false then labels = nil end
  if labels ~= nil and type(labels) ~= "table" then fail(M.E_LABELS) end
  labels = labels or {}
  local inst, owner = labels[M.LABEL_INSTALLATION], labels[M.LABEL_OWNER]
  if not label_ok(inst) or not label_ok(owner) then fail(M.E_LABELS) end
  for k in pairs(labels) do
    if k ~= M.LABEL_INSTALLATION and k ~= M.LABEL_OWNER then fail(M.E_LABELS) end
  end
  if not M.runtime_ok(spec.runtime) then fail(M.E_RUNTIME) end
  return {
    name = spec.name, image = spec.image, runDir = run_dir, workspaceDir = ws_dir,
    uid = uid, gid = gid, memoryMb = mem, cpus = cpus, nanoCpus = nano, pids = pids,
    installation = inst or "", owner = owner or "", labelled = labelled,
    workspaceReadOnly = spec.workspaceReadOnly == true, entrypoint = spec.entrypoint,
    runtime = spec.runtime,
    seccomp = spec.seccompProfile ~= nil and seccomp.load(spec.seccompProfile) or nil,
  }
end

-- The argv of spec 4.3 (without the binary itself): 43 elements (41
-- without a seccomp profile, 2 more with a runtime), then the image. Raises the 4.2 errors. A
-- precheck spec (see the top) drops the two labels, may mount the
-- workspace read-only and names its entrypoint.
function M.args(spec)
  return M.argv(M.check(spec))
end

-- The same argv from a spec M.check returned.
function M.argv(c)
  local argv = {
    "run",
    "--rm",
    "--interactive",
    "--sig-proxy=false",
    "--log-driver", "none",
    "--pull", "never",
    "--name", c.name,
  }
  local function add(...)
    for _, v in ipairs { ... } do argv[#argv + 1] = v end
  end
  if c.labelled then
    add("--label", M.LABEL_INSTALLATION .. "=" .. c.installation,
        "--label", M.LABEL_OWNER .. "=" .. c.owner)
  end
  add("--network", "none",
    "--read-only",
    "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges:true")
  if c.seccomp then add("--security-opt", "seccomp=" .. c.seccomp.path) end
  add("--user", c.uid .. ":" .. c.gid,
    "--memory", c.memoryMb .. "m",
    "--memory-swap", c.memoryMb .. "m",
    "--cpus", c.cpus,
    "--pids-limit", tostring(c.pids),
    "--ulimit", "nofile=256:256",
    "--tmpfs", M.TMPFS,
    "--mount", "type=bind,src=" .. c.runDir .. ",dst=/broker,readonly,bind-propagation=rprivate",
    "--mount", "type=bind,src=" .. c.workspaceDir .. ",dst=/workspace,"
      .. (c.workspaceReadOnly and "readonly," or "") .. "bind-propagation=rprivate",
    "--env", M.ENV)
  if c.runtime then add("--runtime", c.runtime) end
  if c.entrypoint then add("--entrypoint", c.entrypoint[1]) end
  add(c.image)
  if c.entrypoint then
    for i = 2, #c.entrypoint do add(c.entrypoint[i]) end
  end
  return argv
end

local function obj(names, values) return json.object(names, values) end

-- The Engine API body of the same container (spec 4.3 table and JSON shape).
-- Returns the JSON text and the checked spec (for the ?name= query).
function M.engine_body(spec)
  local c = M.check(spec)
  return M.body(c), c
end

-- The same body from a spec M.check returned.
function M.body(c)
  local mem = c.memoryMb * 1048576
  local function mount(src, dst, ro)
    return obj({ "Type", "Source", "Target", "ReadOnly", "BindOptions" }, {
      Type = "bind", Source = src, Target = dst, ReadOnly = ro,
      BindOptions = obj({ "Propagation" }, { Propagation = "rprivate" }),
    })
  end
  local host = obj({ "AutoRemove", "LogConfig", "NetworkMode", "ReadonlyRootfs", "CapDrop",
    "SecurityOpt", "Memory", "MemorySwap", "NanoCpus", "PidsLimit", "Ulimits", "Tmpfs", "Mounts", "Runtime" }, {
    AutoRemove = true,
    LogConfig = obj({ "Type", "Config" }, { Type = "none", Config = obj({}, {}) }),
    NetworkMode = "none",
    ReadonlyRootfs = true,
    CapDrop = json.array { "ALL" },
    SecurityOpt = json.array { "no-new-privileges:true", c.seccomp and ("seccomp=" .. c.seccomp.json) or nil },
    Memory = mem, MemorySwap = mem, NanoCpus = c.nanoCpus, PidsLimit = c.pids,
    Ulimits = json.array { obj({ "Name", "Soft", "Hard" }, { Name = "nofile", Soft = 256, Hard = 256 }) },
    Tmpfs = obj({ "/tmp" }, { ["/tmp"] = M.TMPFS:match("^/tmp:(.*)$") }),
    Mounts = json.array { mount(c.runDir, "/broker", true), mount(c.workspaceDir, "/workspace", false) },
    Runtime = c.runtime,
  })
  local body = obj({ "Image", "User", "Env", "Labels", "AttachStdin", "AttachStdout", "AttachStderr",
    "OpenStdin", "StdinOnce", "Tty", "HostConfig" }, {
    Image = c.image, User = c.uid .. ":" .. c.gid, Env = json.array { M.ENV },
    Labels = obj({ M.LABEL_INSTALLATION, M.LABEL_OWNER },
      { [M.LABEL_INSTALLATION] = c.installation, [M.LABEL_OWNER] = c.owner }),
    AttachStdin = true, AttachStdout = true, AttachStderr = true, OpenStdin = true,
    StdinOnce = true, Tty = false, HostConfig = host,
  })
  return assert(json.encode(body))
end

-- A fresh container name for a channel (4.4): segment is the channel's 64-hex
-- workspace segment (7.5); 8 random hex characters from the OS source.
function M.name(segment)
  if type(segment) ~= "string" or not segment:find("^%x+$") or #segment < 16 then
    error("container.name: a hex channel segment is required", 2)
  end
  local rnd = assert(core.random_hex(4))
  return "roundtable-sandbox-" .. segment:sub(1, 16):lower() .. "-" .. rnd
end

function M.name_valid(name)
  return type(name) == "string" and name:find(M.NAME_PATTERN) ~= nil
    and not name:find("[A-F]")
end

function M.labels(installation, owner)
  return { [M.LABEL_INSTALLATION] = installation, [M.LABEL_OWNER] = owner }
end

-- The turn object of spec 8.2 with its keys in order; tools, mcp and each
-- server's tools as arrays, every parameters as an object, even when empty.
local function as_object(v)
  if type(v) == "table" and getmetatable(v) == nil and next(v) == nil then
    return obj({}, {})
  end
  return v
end

local function tool_list(list)
  local out = json.array {}
  for i, t in ipairs(list or {}) do
    out[i] = obj({ "name", "description", "parameters" },
      { name = t.name, description = t.description, parameters = as_object(t.parameters or {}) })
  end
  return out
end

-- t = {text, speaker = {id, name}, model, prompt, timeZone, reset, tools =
-- {{name, description, parameters}, ...}, mcp = {{server, tools}, ...}};
-- other fields (a tool's run, the speaker's principalId) are left out.
-- Returns the object and its compact JSON; raises when it cannot encode.
function M.turn(t)
  local speaker = t.speaker or {}
  local mcp = json.array {}
  for i, s in ipairs(t.mcp or {}) do
    mcp[i] = obj({ "server", "tools" }, { server = s.server, tools = tool_list(s.tools) })
  end
  local turn = obj({ "text", "speaker", "model", "prompt", "timeZone", "reset", "tools", "mcp" }, {
    text = t.text,
    speaker = obj({ "id", "name" }, { id = speaker.id, name = speaker.name }),
    model = t.model, prompt = t.prompt, timeZone = t.timeZone,
    reset = t.reset == true,
    tools = tool_list(t.tools), mcp = mcp,
  })
  local s, err = json.encode(turn)
  if not s then error(errors.TURN_ENCODING .. tostring(err), 0) end
  return turn, s
end

-- The stdin bytes of a turn: its JSON (a string is taken as already encoded).
function M.turn_json(turn)
  if type(turn) == "string" then return turn end
  local _, s = M.turn(turn)
  return s
end

return M
