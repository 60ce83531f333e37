-- seccomp_images_spec.lua: the rich (Pi) and precheck images' seccomp
-- allow-lists as files (shared/spec/hardening.md 1, issue 21 item 3):
-- what worker/pi/seccomp_gen.py writes, what they allow and never allow,
-- and the startup refusal of the built-in drivers that read them. The live
-- containers are spec/docker/seccomp_spec.lua's.
local json = require "sandbox.json"
local seccomp = require "sandbox.runtime._seccomp"
local spec_fs = require "spec_fs"

local NEVER = {
  "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_init", "fanotify_mark",
  "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key",
  "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
  "userfaultfd", "perf_event_open", "bpf", "ptrace", "mount", "umount2", "unshare", "setns", "pivot_root",
  "mknod", "mknodat", "openat2", "umask", "setuid", "setgid",
}

local function rules_of(path) return json.plain(json.decode(assert(spec_fs.read(path)))) end

-- name -> list of rules naming it
local function by_name(p)
  local t = {}
  for _, r in ipairs(p.syscalls) do
    for _, n in ipairs(r.names) do
      t[n] = t[n] or {}
      table.insert(t[n], r)
    end
  end
  return t
end

describe("the rich and precheck images' seccomp allow-lists", function()
  local dirs = {}
  teardown(function() spec_fs.rmdirs(dirs) end)

  it("are exactly what worker/pi/seccomp_gen.py writes from its commented list", function()
    local out, rc = spec_fs.run("python3 worker/pi/seccomp_gen.py --check 2>&1")
    assert.equal(0, rc, out)
  end)

  for _, kind in ipairs { "rich", "precheck" } do
    it(kind .. ": default EPERM, no forbidden call allowed, each refused by its own rule", function()
      local path = seccomp.default_path(kind)
      assert.matches(kind == "rich" and "/worker/pi/seccomp%.json$" or "/worker/precheck/seccomp%.json$", path)
      local p = rules_of(path)
      assert.equal("SCMP_ACT_ERRNO", p.defaultAction)
      assert.equal(1, p.defaultErrnoRet)
      local t = by_name(p)
      for _, n in ipairs(NEVER) do
        assert.truthy(t[n], n .. " has no rule")
        for _, r in ipairs(t[n]) do
          assert.equal("SCMP_ACT_ERRNO", r.action, n)
          assert.equal(1, r.errnoRet, n)
        end
      end
      -- clone3 answers ENOSYS so glibc falls back to clone, allowed only without CLONE_NEW*
      assert.equal(1, #t.clone3)
      assert.equal(38, t.clone3[1].errnoRet)
      for _, r in ipairs(t.clone) do
        assert.truthy(r.args, "clone is never allowed unconditionally")
      end
      -- every allowed mode-taking call is conditional
      for _, n in ipairs { "chmod", "fchmod", "fchmodat", "mkdir", "mkdirat", "open", "openat", "creat" } do
        for _, r in ipairs(t[n]) do
          assert.truthy(r.args, n .. " has an unconditional rule")
        end
      end
      local loaded = seccomp.load(path)
      assert.is_true(loaded.count > 50)
      assert.equal(loaded.count, seccomp.count(p))
    end)
  end

  it("rich allows what the rich worker and Claude Code need; precheck stays smaller", function()
    local r, pc = seccomp.load(seccomp.default_path("rich")), seccomp.load(seccomp.default_path("precheck"))
    assert.is_true(r.count > pc.count)
    local rt = by_name(rules_of(r.path))
    local pt = by_name(rules_of(pc.path))
    for _, n in ipairs { "vfork", "wait4", "pidfd_open", "bind", "listen", "accept4", "socketpair" } do
      assert.equal("SCMP_ACT_ALLOW", rt[n][1].action, n)
      assert.is_nil(pt[n], n .. " is allowed to a precheck script")
    end
  end)

  it("a missing or malformed profile stops the built-in rich and precheck drivers at construction", function()
    local dir = spec_fs.tmpdir("scimg", dirs)
    local missing, bad = dir .. "/none.json", dir .. "/bad.json"
    spec_fs.write(bad, "{ not json")
    local rich = require "sandbox.rich"
    local precheck_docker = require "sandbox.precheck._docker"
    local cli = { binary = "docker" }
    for _, case in ipairs { { missing, "seccomp profile missing: " }, { bad, "seccomp profile invalid: " } } do
      local ok, err = pcall(rich.dockerDriver, { seccompProfile = case[1] })
      assert.is_false(ok)
      assert.equal(case[2] .. case[1], err)
      ok, err = pcall(precheck_docker.new, cli, case[1])
      assert.is_false(ok)
      assert.equal(case[2] .. case[1], err)
    end
    -- the defaults load: the drivers report which profile they hold
    local d = rich.dockerDriver {}
    assert.equal(seccomp.default_path("rich"), d.seccomp.path)
    assert.equal(seccomp.default_path("precheck"), precheck_docker.new(cli).seccomp.path)
  end)
end)
