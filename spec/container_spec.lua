-- container_spec.lua: the container as data (spec/runtime.md 4.2-4.4, 8.2;
-- behaviours 13-16, 46).
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local json = require "sandbox.json"
local spec_fs = require "spec_fs"

local W_read = spec_fs.read
local INST = string.rep("0123456789abcdef", 4)
local OWNER = "0f8fad5b-d9cb-469f-a165-70867728950e:4242:123456"

describe("container", function()
  local dir, run_dir, ws_dir
  setup(function()
    dir = spec_fs.tmpdir("sbx-spec")
    run_dir, ws_dir = dir .. "/run/turn-abc123", dir .. "/work/" .. string.rep("ab", 32)
    os.execute("mkdir -p '" .. run_dir .. "' '" .. ws_dir .. "' '" .. dir .. "/a,b' '" .. dir .. "/real'")
    os.execute("ln -s '" .. dir .. "/real' '" .. dir .. "/link'")
    os.execute("ln -s / '" .. dir .. "/root'")
  end)
  teardown(function() os.execute("rm -rf '" .. dir .. "'") end)

  local function spec(over)
    local s = {
      name = "roundtable-sandbox-abababababababab-0123abcd", image = "pi-roundtable-sandbox:local",
      runDir = run_dir, workspaceDir = ws_dir, uid = 1000, gid = 1001,
      memoryMb = 512, cpus = 1, pids = 64, labels = container.labels(INST, OWNER),
    }
    for k, v in pairs(over or {}) do
      if v == "nil" then s[k] = nil else s[k] = v end
    end
    return s
  end

  local function refused(over, msg)
    local ok, err = pcall(container.args, spec(over))
    assert.is_false(ok, "accepted: " .. tostring(next(over or {})))
    assert.equal(msg, err)
  end

  describe("argv (4.3; 13)", function()
    it("equals the table element for element for the default limits (42, image last)", function()
      assert.same({
        "run", "--rm", "--interactive", "--sig-proxy=false",
        "--log-driver", "none", "--pull", "never",
        "--name", "roundtable-sandbox-abababababababab-0123abcd",
        "--label", "roundtable.sandbox.installation=" .. INST,
        "--label", "roundtable.sandbox.owner=" .. OWNER,
        "--network", "none", "--read-only", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges:true",
        "--user", "1000:1001", "--memory", "512m", "--memory-swap", "512m",
        "--cpus", "1", "--pids-limit", "64", "--ulimit", "nofile=256:256",
        "--tmpfs", "/tmp:rw,noexec,nosuid,nodev,size=64m,mode=1777",
        "--mount", "type=bind,src=" .. run_dir .. ",dst=/broker,readonly,bind-propagation=rprivate",
        "--mount", "type=bind,src=" .. ws_dir .. ",dst=/workspace,bind-propagation=rprivate",
        "--env", "HOME=/tmp/home",
        "pi-roundtable-sandbox:local",
      }, container.args(spec()))
      assert.equal(42, #container.args(spec()))
    end)

    it("formats cpus as the exact decimal without exponent or trailing zeros", function()
      local function cpus(v) return container.args(spec { cpus = v })[29] end
      assert.equal("0.5", cpus(0.5))
      assert.equal("1.5", cpus(1.5))
      assert.equal("2", cpus(2.0))
      assert.equal("0.000000001", cpus(1e-9))
      assert.equal("0.1", cpus(0.1))
      assert.equal("1000000000", cpus(1e9))
      assert.equal("256m", container.args(spec { memoryMb = 256.0 })[25])
      assert.equal("32", container.args(spec { pids = 32.0 })[31])
    end)

    it("canonicalises mount sources (an operator symlink cannot redirect a mount)", function()
      local a = container.args(spec { workspaceDir = dir .. "/link" })
      assert.equal("type=bind,src=" .. dir .. "/real,dst=/workspace,bind-propagation=rprivate", a[39])
      local b = container.args(spec { workspaceDir = dir .. "/work/../link/." })
      assert.equal(a[39], b[39])
    end)

    it("never carries an entrypoint, command, workdir, another env, privileged or -v", function()
      local a = container.args(spec())
      local seen = {}
      for _, v in ipairs(a) do seen[v] = true end
      for _, f in ipairs { "--entrypoint", "--workdir", "-w", "--init", "--hostname", "--stop-timeout",
        "--cidfile", "--detach", "-d", "--privileged", "-v", "--volume", "--device", "-p", "--publish",
        "--add-host", "--pid", "--ipc", "--userns", "-e" } do
        assert.is_nil(seen[f], f)
      end
      local envs = 0
      for _, v in ipairs(a) do if v == "--env" then envs = envs + 1 end end
      assert.equal(1, envs)
    end)
  end)

  describe("validation (4.2; 15)", function()
    it("refuses bad names and images", function()
      local E = "invalid container name or image"
      for _, n in ipairs { "", "-x", "Upper", "a b", "_x", string.rep("a", 92), "a/b", 7 } do
        refused({ name = n }, E)
      end
      for _, i in ipairs { "", "-image", "a b", "a\tb", "caf\u{e9}", "a\127", 1 } do
        refused({ image = i }, E)
      end
      refused({ name = "nil" }, E)
      assert.equal(42, #container.args(spec { name = string.rep("a", 91) }))
      assert.equal(42, #container.args(spec { name = "sandbox-preflight" }))
    end)

    it("refuses uid or gid that are not integers > 0", function()
      local E = "sandbox requires a non-root user and group"
      for _, v in ipairs { 0, -1, 1.5, "1000", true } do
        refused({ uid = v }, E)
        refused({ gid = v }, E)
      end
      refused({ uid = "nil" }, E)
      assert.equal("1000:1000", container.args(spec { uid = 1000.0, gid = 1000 })[23])
    end)

    it("refuses mount paths that are relative, /, with a comma, LF or CR, or missing", function()
      local E = "mount paths must be absolute dedicated directories"
      for _, p in ipairs { "relative", "/", dir .. "/a,b", dir .. "/x\ny", dir .. "/x\ry",
        dir .. "/missing", dir .. "/root", "" } do
        refused({ runDir = p }, E)
        refused({ workspaceDir = p }, E)
      end
      refused({ runDir = "nil" }, E)
    end)

    it("refuses equal or nested mount sources, also through a symlink", function()
      local E = "broker and workspace mounts must be separate"
      refused({ workspaceDir = run_dir }, E)
      refused({ workspaceDir = dir .. "/run" }, E)
      refused({ runDir = ws_dir, workspaceDir = dir .. "/work" }, E)
      refused({ runDir = dir .. "/real", workspaceDir = dir .. "/link" }, E)
    end)

    it("refuses limits outside 2.3", function()
      local E = "invalid resource limits"
      for _, o in ipairs {
        { memoryMb = 63 }, { memoryMb = 64.5 }, { memoryMb = "512" }, { memoryMb = math.maxinteger },
        { cpus = 0 }, { cpus = -1 }, { cpus = 0.0000000001 }, { cpus = 0 / 0 }, { cpus = math.huge },
        { cpus = "1" }, { cpus = 1e10 }, { cpus = 1 / 3 },
        { pids = 7 }, { pids = 8.5 }, { pids = "64" },
      } do
        refused(o, E)
      end
      assert.equal(42, #container.args(spec { memoryMb = 64, pids = 8, cpus = 9223372036 }))
    end)

    it("checks in table order: name before uid before mounts before limits", function()
      refused({ name = "-", uid = 0, runDir = "x", cpus = 0 }, "invalid container name or image")
      refused({ uid = 0, runDir = "x", cpus = 0 }, "sandbox requires a non-root user and group")
      refused({ runDir = "x", cpus = 0 }, "mount paths must be absolute dedicated directories")
      refused({ workspaceDir = run_dir, cpus = 0 }, "broker and workspace mounts must be separate")
    end)

    it("accepts the construction dry run's empty labels", function()
      local a = container.args(spec { name = "sandbox-preflight", labels = {} })
      assert.equal("roundtable.sandbox.installation=", a[12])
    end)
  end)

  describe("Engine API body (4.3; 14)", function()
    it("equals the documented JSON shape for the same spec", function()
      local body = container.engine_body(spec())
      assert.equal('{"Image":"pi-roundtable-sandbox:local","User":"1000:1001","Env":["HOME=/tmp/home"],'
        .. '"Labels":{"roundtable.sandbox.installation":"' .. INST .. '","roundtable.sandbox.owner":"' .. OWNER .. '"},'
        .. '"AttachStdin":true,"AttachStdout":true,"AttachStderr":true,"OpenStdin":true,"StdinOnce":true,"Tty":false,'
        .. '"HostConfig":{"AutoRemove":true,"LogConfig":{"Type":"none","Config":{}},"NetworkMode":"none",'
        .. '"ReadonlyRootfs":true,"CapDrop":["ALL"],"SecurityOpt":["no-new-privileges:true"],'
        .. '"Memory":536870912,"MemorySwap":536870912,"NanoCpus":1000000000,"PidsLimit":64,'
        .. '"Ulimits":[{"Name":"nofile","Soft":256,"Hard":256}],'
        .. '"Tmpfs":{"/tmp":"rw,noexec,nosuid,nodev,size=64m,mode=1777"},'
        .. '"Mounts":[{"Type":"bind","Source":"' .. run_dir .. '","Target":"/broker","ReadOnly":true,"BindOptions":{"Propagation":"rprivate"}},'
        .. '{"Type":"bind","Source":"' .. ws_dir .. '","Target":"/workspace","ReadOnly":false,"BindOptions":{"Propagation":"rprivate"}}]}}',
        body)
    end)

    it("NanoCpus is the exact integer", function()
      local v = json.decode((container.engine_body(spec { cpus = 0.3 })))
      assert.equal(300000000, v.HostConfig.NanoCpus)
      assert.equal("integer", math.type(v.HostConfig.NanoCpus))
    end)
  end)

  describe("the seccomp profile (hardening.md 1)", function()
    local seccomp = require "sandbox.runtime._seccomp"
    local PROFILE = seccomp.default_path()

    it("the shipped profile is found beside the Lua tree and loads", function()
      assert.matches("/worker/seccomp%.json$", PROFILE)
      local p = seccomp.load(PROFILE)
      assert.is_true(p.count > 40 and p.count < 120, tostring(p.count))
      local v = json.decode(p.json)
      assert.equal("SCMP_ACT_ERRNO", v.defaultAction)
      assert.equal(1, v.defaultErrnoRet)
    end)

    it("adds --security-opt seccomp=<absolute path> right after no-new-privileges (44, image last)", function()
      local a = container.args(spec { seccompProfile = PROFILE })
      assert.equal(44, #a)
      assert.same({ "--security-opt", "no-new-privileges:true", "--security-opt", "seccomp=" .. PROFILE,
        "--user", "1000:1001" }, { table.unpack(a, 20, 25) })
      assert.equal("pi-roundtable-sandbox:local", a[44])
      -- every other element is the 42 of the table, in order
      local plain = container.args(spec())
      table.remove(a, 22)
      table.remove(a, 22)
      assert.same(plain, a)
    end)

    it("puts the profile's JSON inline in the Engine API SecurityOpt", function()
      local v = json.decode((container.engine_body(spec { seccompProfile = PROFILE })))
      local opts = v.HostConfig.SecurityOpt
      assert.equal(2, #opts)
      assert.equal("no-new-privileges:true", opts[1])
      local inline = assert(opts[2]:match("^seccomp=(.*)$"))
      assert.same(json.plain(json.decode(W_read(PROFILE))), json.plain(json.decode(inline)))
    end)

    it("a missing or malformed profile fails with its path", function()
      local missing = dir .. "/no-such-profile.json"
      local ok, err = pcall(container.args, spec { seccompProfile = missing })
      assert.is_false(ok)
      assert.equal("seccomp profile missing: " .. missing, err)
      local bad = dir .. "/bad.json"
      local f = assert(io.open(bad, "w"))
      f:write('{"defaultAction":"SCMP_ACT_ERRNO"}')
      f:close()
      ok, err = pcall(seccomp.load, bad)
      assert.is_false(ok)
      assert.equal("seccomp profile invalid: " .. bad, err)
      ok, err = pcall(seccomp.load, "relative.json")
      assert.equal("seccomp profile missing: relative.json", err)
    end)

    it("allows none of the never-allowed calls and filters the mode and clone arguments", function()
      local v = json.decode(W_read(PROFILE))
      local allowed, never = {}, {}
      for _, rule in ipairs(v.syscalls) do
        for _, n in ipairs(rule.names) do
          if rule.action == "SCMP_ACT_ALLOW" then
            allowed[n] = allowed[n] or {}
            table.insert(allowed[n], rule.args or false)
          else
            never[n] = true
            assert.equal(1, rule.errnoRet)
          end
        end
      end
      for _, n in ipairs { "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
        "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "mq_open",
        "userfaultfd", "perf_event_open", "bpf", "ptrace", "mount", "unshare", "setns", "clone3", "mknod",
        "mknodat" } do
        assert.is_nil(allowed[n], n)
        assert.is_true(never[n], n)
      end
      -- every allowed form of a mode-carrying call is conditional, one masked comparison
      for _, n in ipairs { "chmod", "fchmod", "fchmodat", "mkdir", "mkdirat", "open", "openat", "creat", "clone" } do
        assert.truthy(allowed[n], n)
        for _, args in ipairs(allowed[n]) do
          assert.truthy(args, n .. " is allowed unconditionally")
          assert.equal(1, #args)
          assert.equal("SCMP_CMP_MASKED_EQ", args[1].op)
          assert.equal(0, args[1].valueTwo)
        end
        assert.is_true(never[n], n)
      end
      assert.equal(2114060288, allowed.clone[1][1].value)          -- every CLONE_NEW* bit
    end)
  end)

  describe("names and labels (4.4; 16, 46)", function()
    it("names match the pattern, embed the segment and differ between turns", function()
      local seg = core.sha256_hex("fake:a")
      local a, b = container.name(seg), container.name(seg)
      for _, n in ipairs { a, b } do
        assert.equal(44, #n)
        assert.matches("^roundtable%-sandbox%-" .. seg:sub(1, 16) .. "%-%x%x%x%x%x%x%x%x$", n)
        assert.is_true(container.name_valid(n))
        assert.is_nil(n:find("[A-F]"))
      end
      assert.not_equal(a, b)
    end)

    it("every argv carries both labels and only two", function()
      local a = container.args(spec())
      local labels = {}
      for i, v in ipairs(a) do if v == "--label" then labels[#labels + 1] = a[i + 1] end end
      assert.same({ "roundtable.sandbox.installation=" .. INST, "roundtable.sandbox.owner=" .. OWNER }, labels)
      local ok, err = pcall(container.args, spec { labels = { extra = "x" } })
      assert.is_false(ok)
      assert.equal("invalid container labels", err)
    end)
  end)

  describe("turn JSON (8.2)", function()
    it("keeps the key order and encodes empty lists as arrays and parameters as objects", function()
      assert.equal('{"text":"hello","speaker":{"id":"guest","name":"Guest"},"model":"fake",'
        .. '"prompt":"Use the supplied tools","timeZone":"Asia/Taipei","reset":false,"tools":[],"mcp":[]}',
        container.turn_json { mcp = {}, tools = {}, reset = false, timeZone = "Asia/Taipei",
          prompt = "Use the supplied tools", model = "fake",
          speaker = { name = "Guest", id = "guest", principalId = "p_guest" }, text = "hello" })
      assert.equal('{"text":"t","speaker":{"id":"g","name":"G"},"model":"m","prompt":"p","timeZone":"UTC",'
        .. '"reset":true,"tools":[{"name":"clock","description":"d","parameters":{}}],'
        .. '"mcp":[{"server":"docs","tools":[]}]}',
        container.turn_json { text = "t", speaker = { id = "g", name = "G" }, model = "m", prompt = "p",
          timeZone = "UTC", reset = true, tools = { { name = "clock", description = "d", parameters = {}, run = print } },
          mcp = { { server = "docs", tools = {} } } })
    end)
  end)
end)
