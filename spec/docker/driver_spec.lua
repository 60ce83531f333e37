-- docker/driver_spec.lua: the CLI driver (and the optional Engine API
-- driver, which must make the identical container by the same algorithms)
-- against the real daemon, as the non-root service account (spec/runtime.md
-- 4.3-4.7, 5.4; broker.md 81).
-- Test images are built FROM scratch from spec/fixtures/hostile/probe.c
-- (one static binary, one ENTRYPOINT mode per image) and removed in
-- teardown, with every container the specs created.
local async = require "sandbox.async"
local cli = require "sandbox.drivers.cli"
local engine = require "sandbox.drivers.engine"
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local installation = require "sandbox.runtime._installation"
local json = require "sandbox.json"
local seccomp = require "sandbox.runtime._seccomp"
local D = require "docker_runtime"
-- gVisor's own host threads and processes (the Sentry, the gofer) count in
-- the container's pids cgroup: under runsc a limit below about 40 stops the
-- sandbox from starting at all on this 2-core machine, so the runsc pass
-- uses the product's default of 64 (README, "Container runtime").
local PIDS = D.name == "runsc" and 64 or 32
local signal = require "sandbox.signal"
local probe_images = require "probe_images"
local spec_fs = require "spec_fs"

local sh, q = spec_fs.run, spec_fs.q

local SRC = "spec/fixtures/hostile/probe.c"
local TAG = core.random_hex(4)
local IMAGES = {
  reply = "sbx-driver-spec-reply:" .. TAG,
  slow = "sbx-driver-spec-slow:" .. TAG,
  hostile = "sbx-driver-spec-hostile:" .. TAG,
  noop = "sbx-driver-spec-noop:" .. TAG,
}

describe("drivers against real Docker", function()
  local root, run_dir, ws_dir, inst, owner, docker
  local uid, gid = core.getuid()

  setup(function()
    assert(uid ~= 0, "run the docker specs as the non-root service account (runuser -u sbx)")
    local _, rc = sh("docker info >/dev/null 2>&1")
    assert(rc == 0, "the Docker daemon does not answer")
    root = spec_fs.tmpdir("sbx-spec")
    run_dir, ws_dir = root .. "/run/turn-abc123", root .. "/work/ws"
    os.execute("mkdir -p " .. q(run_dir) .. " " .. q(ws_dir) .. " " .. q(root .. "/ctx"))
    local out, brc = sh("cc -static -O2 -o " .. q(root .. "/ctx/probe") .. " " .. q(SRC) .. " 2>&1")
    assert(brc == 0, "cc -static failed: " .. out)
    for mode, image in pairs(IMAGES) do
      local f = assert(io.open(root .. "/ctx/Dockerfile", "w"))
      f:write("FROM scratch\nCOPY probe /probe\nUSER 1000:1000\nENTRYPOINT [\"/probe\", \"" .. mode .. "\"]\n")
      f:close()
      out, brc = sh("docker build -q -t " .. q(image) .. " " .. q(root .. "/ctx") .. " 2>&1")
      assert(brc == 0, "docker build failed: " .. out)
    end
    inst = installation.id(root .. "/work", root .. "/run")
    owner = installation.owner_id()
    docker = cli { binary = "docker" }
  end)

  -- Every container of this spec's installation, whatever state it is in.
  local function remove_labelled()
    sh("docker ps -aq --filter label=roundtable.sandbox.installation=" .. inst
      .. " | xargs -r docker rm -f >/dev/null 2>&1")
  end

  teardown(function()
    if inst then remove_labelled() end
    for _, image in pairs(IMAGES) do
      probe_images.remove_containers_of(image)
      sh("docker image rm -f " .. q(image) .. " >/dev/null 2>&1")
    end
    if root then os.execute("rm -rf " .. q(root)) end
  end)

  local function spec(image, over)
    local seg = core.sha256_hex("fake:docker")
    local s = {
      name = container.name(seg), image = image, runDir = run_dir, workspaceDir = ws_dir,
      uid = uid, gid = gid, memoryMb = 128, cpus = 0.5, pids = PIDS,
      labels = container.labels(inst, owner),
      seccompProfile = seccomp.default_path(),     -- as every sealed turn (hardening.md 1)
      runtime = D.name,                             -- the docker-runsc pass (docker_runtime.lua)
    }
    for k, v in pairs(over or {}) do s[k] = v end
    return s
  end

  local TURN = { text = "hello", speaker = { id = "guest", name = "Guest" }, model = "fake",
    prompt = "p", timeZone = "UTC", reset = false, tools = {}, mcp = {} }

  local function labelled()
    return sh("docker ps -a --filter label=roundtable.sandbox.installation=" .. inst .. " --format '{{.Names}}'")
  end

  local function docker_async(args)
    return docker:exec(args, { max_stdout = 1048576, max_stderr = 65536, kill_after_ms = 10000 })
  end

  for _, kind in ipairs { "cli", "engine" } do
    describe(kind .. " driver", function()
      local d
      setup(function()
        d = kind == "cli" and cli { binary = "docker" } or engine {}
      end)

      it("runs a turn: stdin delivered, user overridden, read-only root, writable workspace, then removed", function()
        local s = spec(IMAGES.reply)
        local res = async.run(function() return d:run(s, TURN, signal.new()) end)
        local n = #container.turn_json(TURN)
        assert.same({ ok = true, text = "uid=" .. uid .. " gid=" .. gid .. " stdin=" .. n
          .. " home=/tmp/home root=0 workspace=1 broker=0" }, res)
        assert.equal("", labelled())
      end)

      it("the running container's settings read back with docker inspect match 4.3", function()
        local s = spec(IMAGES.slow)
        local info
        async.run(function()
          local task = async.spawn(function() return d:run(s, TURN, signal.new()) end)
          for _ = 1, 40 do
            local r = docker_async { "inspect", s.name }
            if r.exit_status == 0 then
              info = json.decode(r.stdout)[1]
              break
            end
            async.sleep(50)
          end
          local ok, err = async.wait(task)
          assert(ok, tostring(err))
        end)
        assert.truthy(info, "container never seen")
        local h, c = info.HostConfig, info.Config
        assert.equal(s.name, info.Name:gsub("^/", ""))
        assert.is_true(h.AutoRemove)
        assert.equal("none", h.LogConfig.Type)
        assert.equal("none", h.NetworkMode)
        assert.is_true(h.ReadonlyRootfs)
        assert.same({ "ALL" }, { table.unpack(h.CapDrop) })
        assert.is_true(h.CapAdd == nil or h.CapAdd == json.null or #h.CapAdd == 0)
        -- no-new-privileges, then the project's own seccomp profile, inline
        -- for both drivers (the CLI sends the file's JSON; hardening.md 1)
        assert.equal(2, #h.SecurityOpt)
        assert.equal("no-new-privileges:true", h.SecurityOpt[1])
        assert.same(json.plain(json.decode(spec_fs.read(s.seccompProfile))),
          json.plain(json.decode(assert(h.SecurityOpt[2]:match("^seccomp=(.*)$")))))
        assert.equal(128 * 1048576, h.Memory)
        assert.equal(128 * 1048576, h.MemorySwap)
        assert.equal(500000000, h.NanoCpus)
        assert.equal(PIDS, h.PidsLimit)
        assert.equal(1, #h.Ulimits)
        assert.equal("nofile", h.Ulimits[1].Name)
        assert.equal(256, h.Ulimits[1].Soft)
        assert.equal(256, h.Ulimits[1].Hard)
        assert.equal("rw,noexec,nosuid,nodev,size=64m,mode=1777", h.Tmpfs["/tmp"])
        assert.is_false(h.Privileged)
        assert.is_true(h.Binds == nil or h.Binds == json.null)
        assert.equal(2, #h.Mounts)
        assert.same({ "bind", run_dir, "/broker", true, "rprivate" },
          { h.Mounts[1].Type, h.Mounts[1].Source, h.Mounts[1].Target, h.Mounts[1].ReadOnly, h.Mounts[1].BindOptions.Propagation })
        assert.same({ "bind", ws_dir, "/workspace", false, "rprivate" },
          { h.Mounts[2].Type, h.Mounts[2].Source, h.Mounts[2].Target, h.Mounts[2].ReadOnly == true, h.Mounts[2].BindOptions.Propagation })
        assert.equal(uid .. ":" .. gid, c.User)
        local env = {}
        for _, e in ipairs(c.Env) do if not e:find("^PATH=") then env[#env + 1] = e end end
        assert.same({ "HOME=/tmp/home" }, env)   -- (plus the PATH Docker adds to every container)
        assert.same({ ["roundtable.sandbox.installation"] = inst, ["roundtable.sandbox.owner"] = owner },
          (function() local t = {} for k, v in pairs(c.Labels) do t[k] = v end return t end)())
        assert.is_true(c.OpenStdin)
        assert.is_true(c.StdinOnce)
        assert.is_false(c.Tty)
        assert.same({ "/probe", "slow" }, { table.unpack(c.Entrypoint) })
        assert.is_true(c.Cmd == nil or c.Cmd == json.null)
        assert.equal("", c.WorkingDir)
        assert.equal("", labelled())
      end)

      it("removes a SIGTERM-ignoring PID 1 after a 1 s deadline in under 8 s, leaving no container (broker.md 81)", function()
        local s = spec(IMAGES.hostile)
        local sig = signal.new()
        local ok, err, ms = async.run(function()
          local t0 = core.now()
          core.timer(1000, function() sig:abort("sandbox turn timed out") end)
          local ok, err = pcall(d.run, d, s, TURN, sig)
          return ok, err, core.now() - t0
        end)
        assert.is_false(ok)
        assert.equal("sandbox turn timed out", err)
        assert.is_true(ms < 8000, "took " .. ms .. " ms")
        -- Once under runsc the daemon still listed the container right after
        -- both removals had succeeded: the state it reports goes to the log,
        -- and a container the daemon is itself still removing has 5 s to go
        -- (one that stays, running or never started, fails the case).
        local function left_behind()
          local names, rc = sh("docker ps -a --filter ancestor=" .. q(IMAGES.hostile) .. " --format '{{.Names}}'")
          assert.equal(0, rc)
          return names
        end
        local function state()
          return sh("docker ps -a --no-trunc --filter name=" .. q(s.name)
            .. " --format '{{.Names}} {{.Status}} {{.CreatedAt}}'; date -u +%T.%N")
        end
        local names = left_behind()
        if names ~= "" then
          io.stderr:write("driver_spec: still listed after the removals: ", state(), "\n")
          for _ = 1, 50 do
            os.execute("sleep 0.1")
            names = left_behind()
            if names == "" then break end
          end
        end
        assert.equal("", names, names ~= "" and state() or nil)
        assert.equal("", labelled())
      end)

      -- An abort while the daemon is still creating the container: the
      -- removal must not find "no such container" and return while the
      -- create completes behind it (a container left in Created state).
      -- Aborts land 0-35 ms after the run starts, across the create.
      it("leaves no container when the turn is aborted while the daemon creates it", function()
        local left = {}
        for i = 1, 8 do
          local s = spec(IMAGES.hostile)
          local sig = signal.new()
          async.run(function()
            local t = core.timer((i - 1) * 5, function() sig:abort("sandbox turn stopped") end)
            local ok, err = pcall(d.run, d, s, TURN, sig)
            t:stop()
            assert.is_false(ok)
            assert.equal("sandbox turn stopped", err)
          end)
          -- whatever the daemon was still doing for that run has had 500 ms
          async.run(function() async.sleep(500) end)
          local names = labelled()
          if names ~= "" then left[#left + 1] = ((i - 1) * 5) .. " ms: " .. names end
          remove_labelled()
        end
        assert.same({}, left)
      end)

      it("a missing image fails with the image_missing error (the daemon says so) and leaves nothing", function()
        local s = spec("sbx-driver-spec-missing:" .. TAG)
        local ok, err = pcall(async.run, function() return d:run(s, TURN, signal.new()) end)
        assert.is_false(ok)
        assert.equal("sandbox image is missing", err)
        assert.equal("", labelled())
      end)

      it("lists labelled containers with their owner and removes by exact name", function()
        local name = container.name(core.sha256_hex("fake:list"))
        local gone = "00000000-0000-4000-8000-000000000000:1:1"
        local out, rc = sh("docker create --label roundtable.sandbox.installation=" .. inst
          .. " --label roundtable.sandbox.owner=" .. gone .. " --name " .. name .. " " .. q(IMAGES.hostile) .. " 2>&1")
        assert.equal(0, rc, out)
        local list = async.run(function() return d:list(inst) end)
        assert.same({ { name = name, owner = gone } }, list)
        local n = async.run(function()
          return installation.sweep { driver = d, installation = inst, self = owner, log = function() end }
        end)
        assert.equal(1, n)
        assert.equal("", labelled())
        -- removing an absent name is success ("No such container")
        async.run(function() d:remove(name) end)
      end)
    end)
  end
end)
