-- cli/doctor.lua: `sbx doctor CONFIG.lua`: checks what `sbx run` would refuse
-- and what a sealed turn needs, one line per check, `ok` or `FAIL` with the
-- exact fix (spec/operations.md 5, runtime.md 3.4). It changes nothing: it
-- never creates the roots, takes the lock or starts a container.
--
-- One check path, not copies: the construction checks are the runtime's own
-- steps (runtime/_options.lua M.check_all, the same functions `sbx run`
-- runs, in dry mode), the state file is read by the channel store's own
-- loader (channels.load, dry), the daemon is asked through the turns' own
-- docker driver, the model probe goes through the broker's model call
-- (broker.model_call: the same request rebuild, headers, upstream client
-- and error tokens as /model), and every FAIL prints the catalogue's words
-- and fix (sandbox/errors.lua).
local args_lib = require "sandbox.cli._args"
local async = require "sandbox.async"
local broker = require "sandbox.broker"
local channel_key = require "sandbox.channels._key"
local channels = require "sandbox.channels"
local common = require "sandbox.cli._common"
local container = require "sandbox.drivers._sealed"
local contract = require "sandbox.drivers.contract"
local core = require "sandbox.core"
local credential = require "sandbox.broker._credential"
local errors = require "sandbox.errors"
local installation = require "sandbox.runtime._installation"
local disk = require "sandbox.runtime._disk"
local json = require "sandbox.json"
local modes = require "sandbox.cli._doctor_modes"
local openai_chat = require "sandbox.providers.openai_chat"
local options = require "sandbox.runtime._options"
local seccomp = require "sandbox.runtime._seccomp"
local signal = require "sandbox.signal"

local M = {}

M.help = [==[
usage: sbx doctor CONFIG.lua [--no-docker] [--channel KEY [--speaker ID]] [--probe] [--json]
                  [--options JSON]

CONFIG.lua may return sandbox { ... } (the sealed mode, checked below),
sandbox.rich { ... } (rich mode: its construction checks, partyDir
private, the socket path, the daemon, the image) or
sandbox.precheckScriptRunner { ... } (its construction checks, runRoot
private, the daemon, the image). --options JSON is the config's argument
(`...`), as the Bun bridge's `options` gives it.

Checks, one line each, and names the fix for every failure, in the words
`sbx run` would use:
  config          the file loads and returns a valid sandbox { ... }
  options .. broker   every construction check of `sbx run` (option names,
                  model, apiKey against modelAuth, prompt, log options, time
                  zone, turnTimeoutMs, runRoot, workspaceRoot, roots, user,
                  socket path, container runtime name, image and limits,
                  docker endpoint, the broker configuration and the model
                  route it will use: host, auth mode, output field and
                  limit, never the key)
  stateFile       the channel state file: absolute, outside the roots, its
                  directory private, the file parses
  descriptors     the descriptor limit the host raises itself to (the hard
                  RLIMIT_NOFILE; shared/spec/hardening.md 2)
  disk            free space on the roots' filesystems against diskReserveMb
  workspace       with --channel: that channel's workspace against
                  workspaceQuotaMb (its turns are refused above it)
  docker          the daemon answers on a local socket (the turns' own driver)
  daemon runtime  with runtime set: the daemon has that runtime registered
                  (`docker info` runtimes; for runsc the fix is
                  `make deps RUNSC=1`)
  image           the configured image exists (the fix names this tree's
                  own build command: `make image` in a checkout, an
                  installed tree's build-image)
  docker data     both roots outside the daemon's data directory
  stale           no leftover containers of this installation (`sbx cleanup`)
  apiKey call     with --channel: the hook called once for that scope
  probe           with --probe: one real request to modelUrl
Exits 0 when every check passed, 1 otherwise (2 for usage errors).

  --no-docker     skip the checks that ask the daemon (docker, daemon
                  runtime, image, docker data, stale)
  --channel KEY   call apiKey (and each MCP server's apiKey) once with the
                  scope {channel = KEY, speaker = ID}; report only whether
                  it returned a credential, never the credential; and
                  measure that channel's workspace
  --speaker ID    ID[:NAME[:PRINCIPAL]] for --channel (default sbx-doctor)
  --probe         send one minimal request to modelUrl (one user message
                  "ping", the forced body with the output field set to 1
                  token) through the broker's own upstream client; report
                  the status, the provider's error tokens and the fix. The
                  reply is never printed. The key comes from apiKey with the
                  --channel scope, or the scope sandbox:doctor.
  --options JSON  the config script's argument (a JSON object), e.g.
                  '{"partyDir":"/srv/party"}' for examples/rich.conf.lua
  --json          print the checks as one JSON array of
                  {name, status ("ok"|"fail"|"skip"), detail, message, fix}
]==]

-- The runtimeArgs runsc needs (shared/spec/warm-turns.md 4; scripts/deps.sh
-- registers exactly these): no network of its own, the broker socket, and
-- the container's seccomp profile applied inside the sandbox.
M.RUNSC_ARGS = { "--network=none", "--fsgofer-host-uds", "--oci-seccomp" }
M.PROBE_CHANNEL = "sandbox:doctor"
M.PROBE_SPEAKER = { id = "sbx-doctor", name = "sbx doctor", principalId = "sbx-doctor" }

local function dirname(p)
  local d = p:match("^(.*)/[^/]*$")
  if d == nil or d == "" then return "/" end
  return d
end

local function inside(a, b) -- a equal to b or under it
  return a == b or a:sub(1, #b + 1) == b .. "/"
end

-- Collects check lines; `fails` counts failures.
local function reporter(out, as_json)
  local r = { fails = 0, list = {} }
  local function add(c)
    r.list[#r.list + 1] = c
    if as_json then return end
    if c.status == "ok" then
      out:write((string.format("ok    %-16s %s", c.name, c.detail or ""):gsub("%s+$", "")), "\n")
    elseif c.status == "skip" then
      out:write(string.format("skip  %-16s %s", c.name, c.detail or ""), "\n")
    else
      local what = c.message or ""
      if c.detail and c.detail ~= "" then what = what ~= "" and (what .. ": " .. c.detail) or c.detail end
      out:write(string.format("FAIL  %-16s %s", c.name, what), "\n")
      if c.fix then out:write("      fix: ", c.fix, "\n") end
    end
  end
  function r.ok(name, detail) add { name = name, status = "ok", detail = detail } end
  function r.skip(name, why) add { name = name, status = "skip", detail = why } end
  function r.fail(name, message, detail, fix)
    r.fails = r.fails + 1
    add { name = name, status = "fail", message = message, detail = detail, fix = fix }
  end
  return r
end

-- The fix context of this installation (errors.fix / errors.reason_fix).
local function fix_context(o, path)
  local ctx = common.fix_context({ options = o }, path)
  ctx.command = "doctor"
  return ctx
end

-- The construction checks (runtime/_options.lua STEPS), as `sbx run` runs them.
local function construction(r, cfg, path)
  local o = cfg.options
  local ok, opts, checked = pcall(cfg.runtime_options, cfg, { timeZone = common.time_zone() })
  local api_failure
  if not ok then
    -- sbx has no host login: the apiKey step's own words
    api_failure = opts
    opts, checked = cfg:runtime_options { timeZone = common.time_zone(), hostLogin = function() return nil end }
  end
  local results, state = options.check_all(opts, checked)
  local ctx = fix_context(o, path)
  for _, c in ipairs(results) do
    if c.name == "apiKey" and api_failure then
      r.fail("apiKey", api_failure, nil, errors.fix(api_failure, ctx))
    elseif c.ok == true then
      r.ok(c.name, c.detail)
    elseif c.ok == false then
      local message = errors.safe_to_show(c.message) and c.message or "unexpected error"
      r.fail(c.name, message, c.detail, c.fix or errors.fix(c.message, ctx))
    else
      r.skip(c.name, c.detail)
    end
  end
  return state
end

-- The channel state file (runtime.md 3.2 steps 4-6, 3.3), read-only.
local function state_file(r, cfg, state, path)
  local o = cfg.options
  local ok, err = pcall(function()
    local p = channels.state_path(o.stateFile, state.run_root, state.ws_root, true)
    local keys, _, existed = channels.load({ stateFile = p, initialChannels = o.initialChannels }, true)
    return string.format("%s (%s, %d channel(s))", p, existed and "present" or "created at startup", #keys)
  end)
  if ok then
    r.ok("stateFile", err)
  else
    local message = errors.safe_to_show(err) and err or "unexpected error"
    local fix = errors.fix(err, fix_context(o, path))
    local detail = tostring(o.stateFile)
    local uid = core.getuid()
    if err == errors.STATE_DIR and type(o.stateFile) == "string" then
      local dir = dirname(o.stateFile)
      local st = core.fs_stat(dir)
      detail = dir
      if uid == 0 then
        fix = errors.fix(errors.USER, fix_context(o, path))
      elseif st and st.uid ~= uid then
        fix = string.format("as root: chown %s: %s", common.user_name(), options.shq(dir))
        detail = string.format("%s is owned by uid %d", dir, st.uid)
      elseif st then
        fix = "chmod 700 " .. options.shq(dir)
        detail = string.format("%s has mode %04o (group/other bits set)", dir, st.mode)
      end
    end
    r.fail("stateFile", message, detail, fix)
  end
end

local function mib(bytes) return string.format("%.1f MiB", bytes / 1048576) end

-- shared/spec/hardening.md 2-3 (the seccomp profile is a construction
-- step): the descriptor limit, free disk against the reserve and, with
-- --channel, that channel's workspace against its quota.
local function hardening_checks(r, cfg, state, opts)
  local ok, hard = pcall(options.check_hardening, cfg.options)
  if not ok then return end                       -- the "hardening" step said why
  local _, hard_limit = core.fd_raise()
  r.ok("descriptors", string.format("nofile %s (the hard limit; the host raises itself to it)", tostring(hard_limit)))
  local reserve = hard.diskReserveMb * 1048576
  for _, root in ipairs { state.run_root, state.ws_root } do
    local st = root and core.fs_statfs(root)
    if st and st.free < reserve then
      r.fail("disk", errors.DISK_LOW, string.format("%s: %s free, diskReserveMb %d", root, mib(st.free),
        hard.diskReserveMb), errors.reason_fix("disk_low"))
    elseif st then
      r.ok("disk", string.format("%s: %s free (diskReserveMb %d)", root, mib(st.free), hard.diskReserveMb))
    end
  end
  if not opts.channel or not state.ws_root then return end
  local dir = state.ws_root .. "/" .. channel_key.segment(opts.channel)
  if not core.fs_lstat(dir) then
    r.ok("workspace", dir .. " (not used yet)")
    return
  end
  local u = core.fs_usage(dir, disk.MAX_ENTRIES)
  local fix = errors.reason_fix("workspace_quota", { workspace = dir })
  if u.error or not u.complete then
    r.fail("workspace", errors.WORKSPACE_QUOTA, string.format("%s could not be measured within %d entries",
      dir, disk.MAX_ENTRIES), fix)
  elseif u.bytes > hard.workspaceQuotaMb * 1048576 then
    r.fail("workspace", errors.WORKSPACE_QUOTA, string.format("%s holds %s, over workspaceQuotaMb (%d MiB)",
      dir, mib(u.bytes), hard.workspaceQuotaMb), fix)
  else
    r.ok("workspace", string.format("%s holds %s of workspaceQuotaMb %d (%d entries)", dir, mib(u.bytes),
      hard.workspaceQuotaMb, u.entries))
  end
end

-- The configured runtime is one the daemon has registered
-- (shared/spec/warm-turns.md 4); nothing to ask for the daemon's default or
-- for a name the "runtime" step already refused.
-- The rich (Pi) and precheck images' own seccomp profiles (hardening.md 1,
-- issue 21 item 3), which their built-in drivers read at startup: each one's
-- path and how many system calls it allows.
M.IMAGE_PROFILES = {
  { kind = "rich", file = "worker/pi/seccomp.json" },
  { kind = "precheck", file = "worker/precheck/seccomp.json" },
}
local function image_profiles(r)
  for _, p in ipairs(M.IMAGE_PROFILES) do
    local ok, got = pcall(seccomp.load, seccomp.default_path(p.kind))
    if ok then
      r.ok("seccomp " .. p.kind, string.format("%s (allows %d system calls; everything else fails with EPERM)",
        got.path, got.count))
    else
      r.fail("seccomp " .. p.kind, tostring(got), nil, "restore " .. p.file
        .. " from the project (python3 worker/pi/seccomp_gen.py writes it; make install ships it)")
    end
  end
end

local function runtime_check(r, docker, name)
  if name == nil or not container.runtime_ok(name) then return end
  local set = docker:runtimes()
  if not set then
    r.fail("daemon runtime", errors.DAEMON, "its runtimes could not be listed", errors.reason_fix("daemon_unavailable"))
    return
  end
  local got = set[name]
  if got and name == "runsc" then
    -- gVisor applies the container's seccomp profile only with --oci-seccomp
    -- (hardening.md 1 must hold under it too), and refuses the bind-mounted
    -- broker socket without host-UDS access
    local have = {}
    for _, a in ipairs(got.args) do have[a] = true end
    local missing = {}
    for _, want in ipairs(M.RUNSC_ARGS) do
      if not have[want] then missing[#missing + 1] = want end
    end
    if #missing > 0 then
      r.fail("daemon runtime", "runsc is registered without " .. table.concat(missing, " "),
        "runtimeArgs " .. (#got.args > 0 and table.concat(got.args, " ") or "none"),
        "as root: make deps RUNSC=1 (registers runsc with " .. table.concat(M.RUNSC_ARGS, " ") .. ")")
      return
    end
  end
  if got then
    r.ok("daemon runtime", name .. " registered" .. (#got.args > 0 and (" (" .. table.concat(got.args, " ") .. ")") or ""))
    return
  end
  local names = {}
  for n in pairs(set) do names[#names + 1] = n end
  table.sort(names)
  local msg = errors.RUNTIME_UNREGISTERED .. name
  r.fail("daemon runtime", msg, "the daemon has " .. (#names > 0 and table.concat(names, ", ") or "none"),
    errors.fix(msg, { runtime = name }))
end

-- The daemon answers, through the turns' own docker driver (drivers/cli.lua):
-- the driver and the daemon's info, or nil after a FAIL line with its fix.
local function daemon(r, ctx)
  local dh = os.getenv("DOCKER_HOST")
  if not contract.local_endpoint(dh) then
    r.fail("docker", errors.REMOTE, "DOCKER_HOST=" .. tostring(dh), errors.fix(errors.REMOTE))
    return nil
  end
  local docker = common.docker()
  local user = common.user_name()
  local info, why = docker:inspect_daemon()
  if not info then
    if why == "not found" then
      r.fail("docker", "the docker CLI is not installed", nil, "as root: make deps (or apt-get install docker.io)")
    elseif why == "cannot run" then
      r.fail("docker", "cannot run docker", nil, "check that the docker CLI is installed and executable")
    elseif why == "permission denied" then
      r.fail("docker", user .. " may not use the Docker socket", nil,
        string.format("as root: usermod -aG docker %s (then log in again)", user))
    else
      r.fail("docker", errors.DAEMON, dh and dh ~= "" and ("DOCKER_HOST=" .. dh) or nil,
        errors.reason_fix("daemon_unavailable", ctx))
    end
    return nil
  end
  r.ok("docker", "daemon " .. (info.version or "?") .. " answers")
  return docker, info
end

local function docker_checks(r, cfg, state, path)
  local o = cfg.options
  local ctx = fix_context(o, path)
  local docker, info = daemon(r, ctx)
  if not docker then return end
  runtime_check(r, docker, o.runtime)

  local image = o.image
  if type(image) == "string" and image ~= "" then
    if docker:inspect_image(image) then
      r.ok("image", image .. " present")
    else
      r.fail("image", errors.IMAGE_MISSING, image .. " (turns would fail with image_missing)",
        errors.reason_fix("image_missing", ctx))
    end
  end

  local rr, wr = state.run_root, state.ws_root
  if info.root and info.root ~= "" and rr and wr then
    local dr = core.realpath(info.root) or info.root
    local bad
    for _, root in ipairs({ rr, wr }) do
      if inside(root, dr) then bad = root end
    end
    if bad then
      r.fail("docker data", bad .. " is inside Docker's data directory " .. dr, nil,
        "move runRoot and workspaceRoot outside " .. dr)
    else
      r.ok("docker data", "roots outside " .. dr)
    end
  end

  if rr and wr and core.fs_stat(rr) and core.fs_stat(wr) then
    local listed, list = pcall(docker.list, docker, installation.id(wr, rr))
    if listed then
      if #list == 0 then
        r.ok("stale", "no containers of this installation")
      else
        r.fail("stale", #list .. " container(s) of this installation exist (stale unless a host is running a turn)",
          nil, "sbx cleanup " .. options.shq(path) .. " --force")
      end
    end
  end
end

-- Calls hook once with scope and says only what came back (never the key):
-- "returned a credential" or the failure's reason and fix. model: nil/""
-- fail the model route; an MCP hook's nil/"" means unauthenticated.
local function call_hook(hook, scope, sig, model)
  local status, value = credential.call_hook(hook, scope, sig)
  if status ~= "ok" then
    if value == "raised" then return false, "credential_error", "the hook raised an error" end
    return false, "credential_missing", "the hook did not return in time"
  end
  if credential.valid(value) then return true, "returned a credential", nil, value end
  if not model and (value == nil or value == "") then return true, "returned none (unauthenticated calls)" end
  local what = value == nil and "nil" or value == "" and '""' or type(value) ~= "string" and ("a " .. type(value))
    or "a string that is not a usable credential (empty, too long, or not visible ASCII)"
  return false, "credential_missing", "returned " .. what
end

local function scope_of(parsed)
  return {
    channel = parsed.channel or M.PROBE_CHANNEL,
    speaker = parsed.speaker or M.PROBE_SPEAKER,
  }
end

-- --channel: apiKey and each MCP apiKey, once each.
local function key_checks(r, cfg, state, parsed)
  local o = cfg.options
  local auth = state.cfg and state.cfg.modelAuth or o.modelAuth or "bearer"
  if not parsed.channel then
    if auth ~= "none" then r.skip("apiKey call", "not called (use --channel KEY to call it once)") end
    return nil
  end
  local sig = signal.new()
  local key
  if auth == "none" then
    r.ok("apiKey call", 'not called: modelAuth = "none" sends no credential')
  elseif type(o.apiKey) ~= "function" then
    r.fail("apiKey call", errors.API_KEY_REQUIRED, nil, errors.fix(errors.API_KEY_REQUIRED))
  else
    local ok, why, detail, value = call_hook(o.apiKey, credential.scope(parsed.channel, parsed.speaker), sig, true)
    if ok then
      r.ok("apiKey call", string.format("%s for channel %s", why, parsed.channel))
      key = value
    else
      r.fail("apiKey call", why, detail .. " for channel " .. parsed.channel, errors.reason_fix(why))
    end
  end
  for _, s in ipairs(state.cfg and state.cfg.server_list or {}) do
    if s.apiKey then
      local ok, why, detail = call_hook(s.apiKey, credential.scope(parsed.channel, parsed.speaker), sig, false)
      if ok then r.ok("mcp " .. s.name .. " apiKey", why)
      else r.fail("mcp " .. s.name .. " apiKey", why, detail, errors.reason_fix(why)) end
    end
  end
  return key
end

-- --probe: one minimal model call through the broker's own path.
local function probe(r, cfg, state, parsed, key)
  local bcfg = state.cfg
  if not bcfg then
    r.skip("probe", "needs the broker configuration")
    return
  end
  if bcfg.modelAuth ~= "none" and key == nil then
    local hook = cfg.options.apiKey
    if type(hook) ~= "function" then
      r.fail("probe", errors.API_KEY_REQUIRED, nil, errors.fix(errors.API_KEY_REQUIRED))
      return
    end
    local sc = scope_of(parsed)
    local status, value = credential.call_hook(hook, credential.scope(sc.channel, sc.speaker), signal.new())
    if status ~= "ok" or not credential.valid(value) then
      local why = status == "error" and value == "raised" and "credential_error" or "credential_missing"
      r.fail("probe", why, "apiKey gave no credential for " .. sc.channel, errors.reason_fix(why))
      return
    end
    key = value
  end
  local body = json.object({ "messages" }, { messages = json.array {
    json.object({ "role", "content" }, { role = "user", content = "ping" }) } })
  local forced = openai_chat.rebuild(body, bcfg.model, 1, bcfg.outputTokensField)
  local sig = signal.new()
  local value, reason, info = broker.model_call(bcfg, key, forced, sig, core.now() + broker.CALL_DEADLINE_MS)
  key = nil
  local where = string.format("%s auth=%s %s=1", tostring(bcfg.modelHost), bcfg.modelAuth, bcfg.outputTokensField)
  if value ~= nil then
    r.ok("probe", string.format("status=%s %s", tostring(info.status or 200), where))
    return
  end
  if reason == "upstream_status" then
    local tokens = {}
    for _, k in ipairs { "code", "type", "param" } do
      if info[k] then tokens[#tokens + 1] = k .. "=" .. info[k] end
    end
    local fix = require("sandbox.broker._upstream_error").fix(info.status, info, broker.fix_context(bcfg))
    r.fail("probe", "model call refused upstream", string.format("status=%s%s (%s)", tostring(info.status),
      #tokens > 0 and (" " .. table.concat(tokens, " ")) or "", where),
      fix or errors.reason_fix("upstream_status"))
    return
  end
  r.fail("probe", reason, where, errors.reason_fix(reason))
end

-- A rich or precheck config (cli/_doctor_modes.lua).
local function check_mode(r, value, mode, opts, path)
  local ctx = { path = path, no_docker = opts.no_docker, user = common.user_name(),
    fix_ctx = fix_context({}, path) }
  ctx.daemon = function(rep) return daemon(rep, ctx.fix_ctx) end
  if mode == "rich" then
    modes.rich(r, value, ctx)
  else
    modes.precheck(r, require("sandbox.precheck").facts(value), ctx)
  end
end

function M.check(cfg, opts, out, mode)
  local r = reporter(out or io.stdout, opts.json)
  local path = opts.config or "CONFIG.lua"
  if mode and mode ~= "sealed" then
    r.ok("config", path .. " (" .. mode .. " mode)")
    check_mode(r, cfg, mode, opts, path)
    return r
  end
  r.ok("config", path)
  local state = construction(r, cfg, path)
  state_file(r, cfg, state, path)
  hardening_checks(r, cfg, state, opts)
  image_profiles(r)
  if opts.no_docker then
    r.skip("docker", "--no-docker")
  else
    docker_checks(r, cfg, state, path)
  end
  local key = key_checks(r, cfg, state, opts)
  if opts.probe then probe(r, cfg, state, opts, key) end
  return r
end

-- The fix for a config that did not load (an unreadable file, a missing
-- one, a script error, a refused option).
local function load_fix(cerr, path, arg, mode)
  if cerr:find("Permission denied", 1, true) then
    return string.format("make %s readable by %s (the account sbx runs as): e.g. as root, chgrp %s %s && chmod g+r %s",
      path, common.user_name(), common.user_name(), options.shq(path), options.shq(path))
  end
  if cerr:find("No such file or directory", 1, true) then
    return "check the path: " .. path .. " does not exist"
  end
  local msg = cerr:match(": (.*)$")
  local ctx = common.fix_context(nil, path)
  arg = type(arg) == "table" and arg or {}
  ctx.mode = mode
  ctx.runRoot = type(arg.runRoot) == "string" and options.shq(arg.runRoot) or nil
  ctx.partyDir = type(arg.partyDir) == "string" and options.shq(arg.partyDir) or nil
  local fix = errors.fix(msg, ctx)
  if msg == errors.RICH_PARTY_DIR then
    -- examples/rich.conf.lua reads it from its argument, as the Bun bridge passes it
    fix = fix .. string.format(" (a config that takes it from its argument: sbx doctor %s --options '{\"partyDir\":\"/srv/party\"}')",
      options.shq(path))
  end
  if fix == nil and errors.entry(msg) and errors.entry(msg).name:find("^RICH_") then
    fix = "correct the sandbox.rich { ... } options (see examples/rich.conf.lua and docs/options.md)"
  elseif fix == nil and mode == "precheck" then
    fix = "correct the sandbox.precheckScriptRunner { ... } options (see examples/precheck.conf.lua and docs/options.md)"
  end
  return fix or "correct the config script (see examples/sandbox.conf.lua)"
end

function M.run(args)
  local parsed, err = args_lib.parse(args, { interleave = true, flags = {
    ["no-docker"] = "bool", channel = "value", speaker = "value", probe = "bool", json = "bool",
    options = "value",
  } })
  if not parsed then
    io.stderr:write("sbx doctor: ", err, "\n\n", M.help)
    return 2
  end
  local path = parsed.positional[1]
  if not path or parsed.positional[2] then
    io.stderr:write("sbx doctor: exactly one CONFIG.lua is required\n\n", M.help)
    return 2
  end
  local f = parsed.flags
  local opts = { config = path, no_docker = f["no-docker"], probe = f.probe, json = f.json }
  if f.speaker and not f.channel then
    io.stderr:write("sbx doctor: --speaker needs --channel\n\n", M.help)
    return 2
  end
  if f.channel then
    if not channel_key.valid(f.channel) then
      io.stderr:write("sbx doctor: invalid --channel '", f.channel, "': use a key like discord:1234\n")
      return 2
    end
    opts.channel = f.channel
    local sp, serr = args_lib.speaker(f.speaker or M.PROBE_SPEAKER.id)
    if not sp then
      io.stderr:write("sbx doctor: ", serr, "\n")
      return 2
    end
    opts.speaker = sp
  end
  local arg
  if f.options then
    arg = json.decode(f.options)
    if json.kind(arg) ~= "object" then
      io.stderr:write("sbx doctor: --options must be a JSON object (the config's argument)\n")
      return 2
    end
    arg = json.plain(arg)
  end
  local cfg, mode, tried = args_lib.load_any(path, arg)
  local r
  if not cfg then
    r = reporter(io.stdout, opts.json)
    r.fail("config", mode, nil, load_fix(mode, path, arg, tried))
  else
    r = async.run(M.check, cfg, opts, io.stdout, mode)
  end
  if opts.json then
    local list = json.array()
    for i, c in ipairs(r.list) do
      list[i] = json.object({ "name", "status", "detail", "message", "fix" }, c)
    end
    io.stdout:write(assert(json.encode(list)), "\n")
  elseif r.fails > 0 then
    io.stdout:write(string.format("\n%d check(s) failed; apply the fixes above and run sbx doctor again\n", r.fails))
  else
    io.stdout:write("\nall checks passed\n")
  end
  return r.fails > 0 and 1 or 0
end

return M
