-- container_runtime_spec.lua: the `runtime` option (shared/spec/warm-turns.md
-- 2 and 4; its behaviour 7, offline): the name rule and its exact error in
-- sandbox{} and sandbox.runtime{}, the ContainerSpec field the runtime hands
-- its driver, `--runtime <name>` in the CLI argv (exactly once, after
-- --env, every 4.3 index kept), HostConfig.Runtime in the Engine API body,
-- and `sbx doctor`'s check that the daemon has it registered (a fake docker
-- binary on PATH). The same Docker specs run under runsc in `make check`
-- (scripts/check.sh, suite docker-runsc).
local async = require "sandbox.async"
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local errors = require "sandbox.errors"
local json = require "sandbox.json"
local options = require "sandbox.runtime._options"
local runtime = require "sandbox.runtime"
local sandbox = require "sandbox"
local fake = require "fake_driver"
local spec_fs = require "spec_fs"

local INST = string.rep("0123456789abcdef", 4)
local OWNER = "0f8fad5b-d9cb-469f-a165-70867728950e:4242:123456"
local GUEST = { id = "guest", name = "Guest", principalId = "p_guest" }
local E = "invalid container runtime"

local function quiet() end
local QUIET = { debug = quiet, info = quiet, warn = quiet, error = quiet }

local roots = {}
teardown(function()
  for _, r in ipairs(roots) do core.fs_rmtree(r) end
end)

local function refusal(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "should fail")
  return err
end

-- Names the rule refuses, and the longest it accepts.
local BAD = { "", "RUNSC", "Runsc", "-runsc", "1runsc", "_x", "run sc", "runsc\n", "runsc/x", "rünsc",
  string.rep("a", 65), 1, true, {} }
local LONGEST = "a" .. string.rep("z", 63)

describe("the runtime name rule (warm-turns.md 2)", function()
  it("accepts nil, runsc, crun, names with _ . - and digits, and 64 characters", function()
    for _, name in ipairs { "runsc", "crun", "runc", "io.containerd.runc.v2", "kata-qemu", "gvisor_kvm", "a", LONGEST } do
      assert.is_true(container.runtime_ok(name), name)
      assert.equal(name, options.check_runtime(name))
    end
    assert.is_true(container.runtime_ok(nil))
    assert.is_nil(options.check_runtime(nil))
  end)

  it("refuses everything else with `invalid container runtime`", function()
    for _, name in ipairs(BAD) do
      assert.is_false(container.runtime_ok(name), tostring(name))
      assert.equal(E, refusal(options.check_runtime, name))
    end
  end)

  it("is in the catalogue with a fix that says what to set", function()
    assert.equal(E, errors.RUNTIME)
    assert.matches('runtime = "runsc"', errors.fix(E), 1, true)
  end)
end)

describe("the container with a runtime (runtime.md 4.3, warm-turns.md 2)", function()
  local dir, run_dir, ws_dir
  setup(function()
    dir = spec_fs.tmpdir("sbx-rt-spec")
    run_dir, ws_dir = dir .. "/run/turn-abc123", dir .. "/work/" .. string.rep("ab", 32)
    os.execute("mkdir -p '" .. run_dir .. "' '" .. ws_dir .. "'")
  end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  local function spec(over)
    local s = {
      name = "roundtable-sandbox-abababababababab-0123abcd", image = "pi-roundtable-sandbox:local",
      runDir = run_dir, workspaceDir = ws_dir, uid = 1000, gid = 1001,
      memoryMb = 512, cpus = 1, pids = 64, labels = container.labels(INST, OWNER),
    }
    for k, v in pairs(over or {}) do s[k] = v end
    return s
  end

  local function count(list, v)
    local n = 0
    for _, x in ipairs(list) do if x == v then n = n + 1 end end
    return n
  end

  it("the argv has --runtime <name> exactly once, right after --env, the image last (44)", function()
    local a = container.args(spec { runtime = "runsc" })
    assert.equal(44, #a)
    assert.equal(1, count(a, "--runtime"))
    assert.same({ "--env", "HOME=/tmp/home", "--runtime", "runsc", "pi-roundtable-sandbox:local" },
      { table.unpack(a, 40, 44) })
    -- every other element is the 42 of the table, in order
    table.remove(a, 42)
    table.remove(a, 42)
    assert.same(container.args(spec()), a)
  end)

  it("without a runtime there is no --runtime at all (the daemon's default)", function()
    local a = container.args(spec())
    assert.equal(42, #a)
    assert.equal(0, count(a, "--runtime"))
    assert.is_nil(json.decode((container.engine_body(spec()))).HostConfig.Runtime)
  end)

  it("keeps the seccomp profile's place and puts the runtime before a precheck entrypoint", function()
    local profile = require("sandbox.runtime._seccomp").default_path()
    local a = container.args(spec { runtime = "crun", seccompProfile = profile })
    assert.equal(46, #a)
    assert.equal("seccomp=" .. profile, a[23])
    assert.same({ "--runtime", "crun", "pi-roundtable-sandbox:local" }, { table.unpack(a, 44, 46) })
    local p = container.args(spec { runtime = "runsc", labels = false, entrypoint = { "/bin/run", "x" } })
    assert.same({ "--env", "HOME=/tmp/home", "--runtime", "runsc", "--entrypoint", "/bin/run",
      "pi-roundtable-sandbox:local", "x" }, { table.unpack(p, #p - 7, #p) })
  end)

  it("the Engine API body carries HostConfig.Runtime, and the argv and body agree", function()
    local v = json.decode((container.engine_body(spec { runtime = "runsc" })))
    assert.equal("runsc", v.HostConfig.Runtime)
    local n = 0
    for k in pairs(v.HostConfig) do if k == "Runtime" then n = n + 1 end end
    assert.equal(1, n)
    assert.is_nil(v.Runtime)   -- HostConfig only, never top level
  end)

  it("refuses a bad name with the exact error, in argv and body alike", function()
    for _, name in ipairs(BAD) do
      assert.equal(E, refusal(container.args, spec { runtime = name }))
      assert.equal(E, refusal(container.engine_body, spec { runtime = name }))
    end
  end)
end)

describe("the runtime option (sandbox{} and sandbox.runtime{})", function()
  local function options_for(root, over)
    local o = {
      logger = QUIET,
      image = "pi-roundtable-sandbox:test", runRoot = root .. "/run", workspaceRoot = root .. "/work",
      model = "fake", modelUrl = "https://models.example/v1/chat/completions",
      apiKey = function() return "k" end, driver = fake.new(fake.reply(true, "done")),
    }
    for k, v in pairs(over or {}) do o[k] = v end
    return o
  end
  local function tmproot() return spec_fs.tmpdir("rto", roots, spec_fs.short_tmp()) end

  it("sandbox{} refuses a bad name with `invalid container runtime` and keeps a good one", function()
    for _, name in ipairs(BAD) do
      assert.equal(E, refusal(sandbox, options_for("/nonexistent-root", { runtime = name })))
    end
    local app = sandbox(options_for("/nonexistent-root", { runtime = "runsc" }))
    assert.equal("runsc", (app:runtime_options({})).runtime)
  end)

  it("sandbox.runtime{} refuses a bad name and hands a good one to every container spec", function()
    if not spec_fs.service_account(pending) then return end
    for _, name in ipairs { "RUNSC", "", string.rep("a", 65) } do
      assert.equal(E, refusal(runtime.new, options_for(tmproot(), { runtime = name })))
    end
    local a
    local d = fake.new(function(s)
      a = container.args(s)   -- while the turn's mount sources exist
      return { ok = true, text = "done" }
    end)
    local rt = runtime.new(options_for(tmproot(), { driver = d, runtime = "runsc" }))
    assert.equal("runsc", rt.options.runtime)
    async.run(function() rt:run_turn("fake:a", GUEST, "hi") end)
    assert.equal("runsc", d.calls[1].spec.runtime)
    assert.equal("--runtime", a[#a - 2])
    assert.equal("runsc", a[#a - 1])
    async.run(function() rt:dispose() end)
  end)

  it("without the option the spec names no runtime (the daemon's default)", function()
    if not spec_fs.service_account(pending) then return end
    local d = fake.new(fake.reply(true, "done"))
    local rt = runtime.new(options_for(tmproot(), { driver = d }))
    assert.is_nil(rt.options.runtime)
    async.run(function() rt:run_turn("fake:a", GUEST, "hi") end)
    assert.is_nil(d.calls[1].spec.runtime)
    async.run(function() rt:dispose() end)
  end)
end)

describe("sbx doctor: the configured runtime is registered (warm-turns.md 4)", function()
  local BUILD = package.cpath:match("(build[%w%-]*)/lua/%?%.so") or "build"
  local BIN = core.realpath(BUILD .. "/sbx") or (BUILD .. "/sbx")

  -- A docker binary that answers the doctor's `docker info` questions; the
  -- Runtimes JSON is read from runtimes.json beside it.
  local FAKE_DOCKER = [[#!/bin/sh
here="$(dirname "$0")"
case "$1 $2 $3" in
  "info --format {{.ServerVersion}}|{{.DockerRootDir}}") echo "24.0|/var/lib/docker-fake"; exit 0 ;;
  "info --format {{json .Runtimes}}") cat "$here/runtimes.json"; exit 0 ;;
  "image inspect --format") echo sha256:fake; exit 0 ;;
  ps*) exit 0 ;;
esac
exit 1
]]

  local dir
  before_each(function()
    dir = spec_fs.tmpdir("sbx-rt-doctor")
    spec_fs.write(dir .. "/docker", FAKE_DOCKER)
    os.execute("chmod 755 " .. spec_fs.q(dir .. "/docker"))
  end)
  after_each(function() core.fs_rmtree(dir) end)

  local function doctor(runtime_line, runtimes)
    spec_fs.write(dir .. "/runtimes.json", runtimes)
    local path = dir .. "/sandbox.conf.lua"
    spec_fs.write(path, string.format([[
return require("sandbox") {
  image = "pi-roundtable-sandbox:local",
  runRoot = %q, workspaceRoot = %q, stateFile = %q,
  model = "spec-model", modelUrl = "https://models.example/v1/chat/completions",
  apiKey = function() return "spec-key" end,
  %s
}
]], dir .. "/run", dir .. "/ws", dir .. "/state/channels.json", runtime_line))
    local out = os.tmpname()
    local cmd = string.format("env -u SBX_DEBUG PATH=%s:\"$PATH\" %s doctor %s >%s 2>&1 </dev/null",
      spec_fs.q(dir), spec_fs.q(BIN), spec_fs.q(path), out)
    os.execute(cmd)
    local text = spec_fs.read(out) or ""
    os.remove(out)
    return text
  end

  local RUNC_ONLY = '{"io.containerd.runc.v2":{"path":"runc"},"runc":{"path":"runc"}}\n'
  local WITH_RUNSC = '{"runc":{"path":"runc"},"runsc":{"path":"/usr/bin/runsc",'
    .. '"runtimeArgs":["--network=none","--fsgofer-host-uds","--oci-seccomp"]}}\n'
  local RUNSC_NO_SECCOMP = '{"runc":{"path":"runc"},"runsc":{"path":"/usr/bin/runsc",'
    .. '"runtimeArgs":["--network=none","--fsgofer-host-uds"]}}\n'

  it("an unregistered runsc fails the step, naming make deps RUNSC=1", function()
    if not spec_fs.service_account(pending) then return end
    local out = doctor('runtime = "runsc",', RUNC_ONLY)
    assert.matches("ok    runtime          runsc", out, 1, true)
    assert.matches("FAIL  daemon runtime   container runtime not registered with the Docker daemon: runsc: "
      .. "the daemon has io.containerd.runc.v2, runc\n      fix: as root: make deps RUNSC=1", out, 1, true)
  end)

  it("another unregistered runtime names the daemon.json registration", function()
    if not spec_fs.service_account(pending) then return end
    local out = doctor('runtime = "crun",', RUNC_ONLY)
    assert.matches("FAIL  daemon runtime   container runtime not registered with the Docker daemon: crun", out, 1, true)
    assert.matches('fix: register it in /etc/docker/daemon.json ("runtimes": {"crun": {"path": "/usr/bin/crun"}})',
      out, 1, true)
  end)

  it("a registered runtime passes; without the option nothing is asked", function()
    if not spec_fs.service_account(pending) then return end
    local out = doctor('runtime = "runsc",', WITH_RUNSC)
    assert.matches("ok    daemon runtime   runsc registered (--network=none --fsgofer-host-uds --oci-seccomp)\n",
      out, 1, true)
    out = doctor("", RUNC_ONLY)
    assert.matches("ok    runtime          the daemon's default\n", out, 1, true)
    assert.is_nil(out:find("daemon runtime", 1, true))
  end)

  it("runsc registered without --oci-seccomp fails (gVisor would not apply the seccomp profile)", function()
    if not spec_fs.service_account(pending) then return end
    local out = doctor('runtime = "runsc",', RUNSC_NO_SECCOMP)
    assert.matches("FAIL  daemon runtime   runsc is registered without --oci-seccomp: runtimeArgs --network=none "
      .. "--fsgofer-host-uds\n      fix: as root: make deps RUNSC=1", out, 1, true)
  end)

  it("a bad name fails the runtime step with the catalogue's words and asks the daemon nothing", function()
    if not spec_fs.service_account(pending) then return end
    local out = doctor('runtime = "gVisor",', WITH_RUNSC)
    assert.matches("FAIL  config", out, 1, true)
    assert.matches(E, out, 1, true)
    assert.is_nil(out:find("daemon runtime", 1, true))
  end)
end)
