-- cli/doctor.lua: `sbx doctor CONFIG.lua`: checks what a sealed turn needs
-- and prints one line per check, `ok` or `FAIL` with the exact command or
-- change that fixes it (spec/runtime.md 3.4). It changes nothing: it never
-- creates the roots, takes the lock or starts a container.
local args_lib = require "sandbox.cli._args"
local async = require "sandbox.async"
local common = require "sandbox.cli._common"
local contract = require "sandbox.drivers.contract"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local installation = require "sandbox.runtime._installation"
local layout = require "sandbox.layout"
local channel_key = require "sandbox.channels._key"
local disk = require "sandbox.runtime._disk"
local options = require "sandbox.runtime._options"
local seccomp = require "sandbox.runtime._seccomp"

local M = {}

M.help = [==[
usage: sbx doctor CONFIG.lua [--no-docker] [--channel KEY]

Checks, one line each, and names the fix for every failure:
  config        the file loads and returns a valid sandbox { ... }
  apiKey        present (mandatory under sbx: there is no host login)
  user          not root; uid/gid options (if set) equal the process's
  docker        the docker CLI is found and the daemon answers on a local socket
  image         the configured image exists (`make image` builds it; an
                installed tree names its own build-image)
  runRoot, workspaceRoot, state directory
                a directory owned by this user with no group/other bits
                (a missing one is created 0700 at startup)
  roots         runRoot and workspaceRoot are separate; stateFile outside both
  socket path   the canonical runRoot is at most 76 bytes
  seccomp       the sealed containers' seccomp profile is readable, and how
                many system calls it allows
  descriptors   the descriptor limit the host raises itself to (the hard
                RLIMIT_NOFILE)
  disk          free space on the roots' filesystems against diskReserveMb
  docker data   both roots outside the daemon's data directory
  stale         no leftover containers of this installation (`sbx cleanup`)
Exits 0 when every check passed, 1 otherwise (2 for usage errors).

  --no-docker   skip the checks that ask the daemon (docker, image,
                docker data, stale)
  --channel KEY also measure that channel's workspace against
                workspaceQuotaMb (its turns are refused above it)
]==]

local OCT_077 = tonumber("077", 8)

local function oct(mode) return string.format("%04o", mode) end

local function dirname(p)
  local d = p:match("^(.*)/[^/]*$")
  if d == nil or d == "" then return "/" end
  return d
end

local function shq(s)
  if s:find("^[%w%./_%-:@]+$") then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function inside(a, b) -- a equal to b or under it
  return a == b or a:sub(1, #b + 1) == b .. "/"
end

-- Collects check lines; `fails` counts failures.
local function reporter(out)
  local r = { fails = 0, lines = {} }
  function r.ok(name, detail)
    local line = string.format("ok    %-16s %s", name, detail or "")
    r.lines[#r.lines + 1] = line
    out:write((line:gsub("%s+$", "")), "\n")
  end
  function r.fail(name, problem, fix)
    r.fails = r.fails + 1
    local line = string.format("FAIL  %-16s %s", name, problem)
    if fix then line = line .. "\n      fix: " .. fix end
    r.lines[#r.lines + 1] = line
    out:write(line, "\n")
  end
  function r.skip(name, why)
    local line = string.format("skip  %-16s %s", name, why)
    r.lines[#r.lines + 1] = line
    out:write(line, "\n")
  end
  return r
end

-- One directory that must be service-owned and private. Returns the
-- canonical path when it exists and passes (or nil).
local function check_dir(r, name, path, uid, user)
  if type(path) ~= "string" or path:sub(1, 1) ~= "/" or path:find("^/+$") then
    r.fail(name, tostring(path) .. " is not an absolute dedicated directory",
      "set " .. name .. " to an absolute path of a directory used only by this package")
    return nil
  end
  local st = core.fs_stat(path)
  if not st then
    -- Missing: startup creates it (and its parents) with mode 0700, which
    -- works only if the nearest existing parent is writable by this user.
    local parent = dirname(path)
    while parent ~= "/" and not core.fs_stat(parent) do parent = dirname(parent) end
    local pst = core.fs_stat(parent)
    if pst and pst.type == "dir" and (pst.uid == uid or pst.mode & 2 ~= 0 or (pst.mode & tonumber("1000", 8)) ~= 0) then
      r.ok(name, path .. " (missing; created 0700 at startup)")
    else
      r.fail(name, path .. " is missing and " .. parent .. " is not writable by " .. user,
        string.format("as root: install -d -m 700 -o %s %s", user, shq(path)))
    end
    return nil
  end
  if st.type ~= "dir" then
    r.fail(name, path .. " is not a directory", "point " .. name .. " at a directory, or remove " .. shq(path))
    return nil
  end
  local bad = false
  if st.uid ~= uid then
    r.fail(name, string.format("%s is owned by uid %d, not %s (uid %d)", path, st.uid, user, uid),
      string.format("as root: chown %s: %s", user, shq(path)))
    bad = true
  end
  if st.mode & OCT_077 ~= 0 then
    r.fail(name, string.format("%s has mode %s (group/other bits set)", path, oct(st.mode)),
      "chmod 700 " .. shq(path))
    bad = true
  end
  if bad then return nil end
  r.ok(name, path .. " (" .. oct(st.mode) .. ", " .. user .. ")")
  return core.realpath(path) or path
end

function M.check(cfg, opts, out)
  local r = reporter(out or io.stdout)
  local o = cfg.options
  local uid, gid = core.getuid()
  local user = common.user_name()
  local path = opts.config or "CONFIG.lua"

  -- apiKey
  if type(o.apiKey) == "function" then
    r.ok("apiKey", "a function (read before every model call)")
  else
    r.fail("apiKey", "missing (sbx has no host login)", errors.fix(errors.API_KEY_REQUIRED))
  end

  -- user
  if uid == 0 then
    r.fail("user", "running as root (refused: workers must not run as root)",
      "run as the service account: runuser -u sbx -- sbx doctor " .. shq(path))
  elseif (o.uid ~= nil and o.uid ~= uid) or (o.gid ~= nil and o.gid ~= gid) then
    r.fail("user", string.format("config uid/gid %s/%s differ from the process's %d/%d",
      tostring(o.uid), tostring(o.gid), uid, gid),
      string.format("set uid = %d, gid = %d in the config, or remove them", uid, gid))
  else
    r.ok("user", string.format("%s (uid %d, gid %d)", user, uid, gid))
  end

  -- directories
  local run_root = check_dir(r, "runRoot", o.runRoot, uid, user)
  local ws_root = check_dir(r, "workspaceRoot", o.workspaceRoot, uid, user)
  local state_dir
  if type(o.stateFile) == "string" and o.stateFile:sub(1, 1) == "/" then
    state_dir = check_dir(r, "state directory", dirname(o.stateFile), uid, user)
  else
    r.fail("state directory", "stateFile " .. tostring(o.stateFile) .. " is not an absolute file path",
      "set stateFile to an absolute path such as $HOME/.local/share/roundtable-sandbox/state/channels.json")
  end

  -- roots separate, state outside them (canonical where they exist)
  local rr = run_root or (type(o.runRoot) == "string" and o.runRoot) or nil
  local wr = ws_root or (type(o.workspaceRoot) == "string" and o.workspaceRoot) or nil
  if rr and wr then
    if inside(rr, wr) or inside(wr, rr) then
      r.fail("roots", "runRoot and workspaceRoot overlap",
        "use two separate directories, neither inside the other")
    elseif state_dir and (inside(state_dir, rr) or inside(state_dir, wr)) then
      r.fail("roots", "the state directory is inside a root",
        "move stateFile outside runRoot and workspaceRoot")
    else
      r.ok("roots", "separate; stateFile outside both")
    end
  end

  -- socket path budget
  if rr then
    if #rr <= 76 then
      r.ok("socket path", string.format("%s is %d bytes (at most 76)", rr, #rr))
    else
      r.fail("socket path", string.format("%s is %d bytes; with /turn-XXXXXX/broker.sock it exceeds 100", rr, #rr),
        errors.fix(errors.SOCKET_TOO_LONG))
    end
  end

  M.check_hardening(r, o, rr, wr, opts.channel)

  if opts.no_docker then
    r.skip("docker", "--no-docker")
    return r
  end

  -- docker and daemon, through the turns' own docker runner (drivers/cli.lua)
  local dh = os.getenv("DOCKER_HOST")
  if not contract.local_endpoint(dh) then
    r.fail("docker", "DOCKER_HOST=" .. dh .. " is not a local socket (remote daemons are unsupported)",
      "unset DOCKER_HOST")
    return r
  end
  local docker = common.docker()
  local info, why = docker:inspect_daemon()
  if not info then
    if why == "not found" then
      r.fail("docker", "the docker CLI is not installed", "as root: make deps (or apt-get install docker.io)")
    elseif why == "cannot run" then
      r.fail("docker", "cannot run docker", "check that the docker CLI is installed and executable")
    elseif why == "permission denied" then
      r.fail("docker", user .. " may not use the Docker socket",
        string.format("as root: usermod -aG docker %s (then log in again)", user))
    else
      r.fail("docker", "the daemon does not answer",
        "start it: as root, make deps (starts dockerd), or dockerd &")
    end
    return r
  end
  local data_root = info.root
  r.ok("docker", "daemon " .. (info.version or "?") .. " answers")

  -- image
  local image = o.image
  if type(image) ~= "string" or image == "" then
    r.fail("image", "no image in the config", "set image = \"pi-roundtable-sandbox:local\"")
  elseif docker:inspect_image(image) then
    r.ok("image", image .. " present")
  else
    r.fail("image", image .. " is missing (turns would fail with `sandbox worker failed`)",
      layout.image_fix(image))
  end

  -- roots outside the daemon's data directory
  if data_root and data_root ~= "" then
    local dr = core.realpath(data_root) or data_root
    local bad
    for _, root in ipairs({ rr or "", wr or "" }) do
      if root ~= "" and inside(root, dr) then bad = root end
    end
    if bad then
      r.fail("docker data", bad .. " is inside Docker's data directory " .. dr,
        "move runRoot and workspaceRoot outside " .. dr)
    else
      r.ok("docker data", "roots outside " .. dr)
    end
  end

  -- stale containers of this installation (the driver's own listing)
  if run_root and ws_root then
    local listed, list = pcall(docker.list, docker, installation.id(ws_root, run_root))
    if listed then
      if #list == 0 then
        r.ok("stale", "no containers of this installation")
      else
        r.fail("stale", #list .. " container(s) of this installation exist (stale unless a host is running a turn)",
          "sbx cleanup " .. shq(path) .. " --force")
      end
    end
  end
  return r
end

local function mib(bytes) return string.format("%.1f MiB", bytes / 1048576) end

-- shared/spec/hardening.md 1-3: the seccomp profile, the descriptor limit,
-- free disk against the reserve and, with --channel, that workspace's size.
function M.check_hardening(r, o, run_root, ws_root, channel)
  local ok, hard = pcall(options.check_hardening, o)
  if not ok then
    r.fail("options", tostring(hard), errors.fix(hard))
    return
  end
  local loaded, profile = pcall(seccomp.load, hard.seccompProfile)
  if loaded then
    r.ok("seccomp", string.format("%s (allows %d system calls; everything else fails with EPERM)",
      profile.path, profile.count))
  else
    r.fail("seccomp", tostring(profile), errors.fix(profile))
  end
  local budget = core.fd_budget()
  local _, hard_limit = core.fd_raise()
  r.ok("descriptors", string.format("nofile %d (the hard limit; raised at startup)", hard_limit or budget.limit))
  local reserve = hard.diskReserveMb * 1048576
  for _, root in ipairs { run_root, ws_root } do
    local st = root and core.fs_statfs(root)
    if st then
      if st.free < reserve then
        r.fail("disk", string.format("%s: %s free, below diskReserveMb (%d MiB): every turn is refused (disk_low)",
          root, mib(st.free), hard.diskReserveMb), errors.fix(errors.DISK_LOW))
      else
        r.ok("disk", string.format("%s: %s free (diskReserveMb %d)", root, mib(st.free), hard.diskReserveMb))
      end
    end
  end
  if channel == nil then return end
  if not channel_key.valid(channel) then
    r.fail("workspace", "--channel " .. channel .. " is not a channel key", errors.fix(errors.CHANNEL))
    return
  end
  if not ws_root then return end
  local dir = ws_root .. "/" .. channel_key.segment(channel)
  local st = core.fs_lstat(dir)
  if not st then
    r.ok("workspace", dir .. " (not used yet)")
    return
  end
  local u = core.fs_usage(dir, disk.MAX_ENTRIES)
  local quota = hard.workspaceQuotaMb * 1048576
  if u.error or not u.complete then
    r.fail("workspace", string.format("%s could not be measured within %d entries (counts as over the quota)",
      dir, disk.MAX_ENTRIES), errors.fix(errors.WORKSPACE_QUOTA, { workspace = dir }))
  elseif u.bytes > quota then
    r.fail("workspace", string.format("%s holds %s, over workspaceQuotaMb (%d MiB): its turns are refused",
      dir, mib(u.bytes), hard.workspaceQuotaMb), errors.fix(errors.WORKSPACE_QUOTA, { workspace = dir }))
  else
    r.ok("workspace", string.format("%s holds %s of workspaceQuotaMb %d (%d entries)", dir, mib(u.bytes),
      hard.workspaceQuotaMb, u.entries))
  end
end

function M.run(args)
  local parsed, err = args_lib.parse(args, { interleave = true, flags = { ["no-docker"] = "bool", channel = "value" } })
  if not parsed then
    io.stderr:write("sbx doctor: ", err, "\n\n", M.help)
    return 2
  end
  local path = parsed.positional[1]
  if not path or parsed.positional[2] then
    io.stderr:write("sbx doctor: exactly one CONFIG.lua is required\n\n", M.help)
    return 2
  end
  local cfg, cerr = args_lib.load_config(path)
  if not cfg then
    local line = string.format("FAIL  %-16s %s", "config", cerr)
    local fix = common.fix_for(cerr:match(": (.*)$"), nil, path)
    io.stdout:write(line, "\n", "      fix: ", fix or "correct the config script (see examples/sandbox.conf.lua)", "\n")
    return 1
  end
  io.stdout:write(string.format("ok    %-16s %s\n", "config", path))
  local r = async.run(M.check, cfg, { config = path, no_docker = parsed.flags["no-docker"],
    channel = parsed.flags.channel }, io.stdout)
  if r.fails > 0 then
    io.stdout:write(string.format("\n%d check(s) failed; apply the fixes above and run sbx doctor again\n", r.fails))
    return 1
  end
  io.stdout:write("\nall checks passed\n")
  return 0
end

return M
