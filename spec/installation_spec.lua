-- installation_spec.lua: the installation lock, label values, the startup
-- sweep and `sbx cleanup` (spec/runtime.md 6; behaviours 10, 46-50), with
-- Lua fake drivers.
local async = require "sandbox.async"
local cleanup = require "sandbox.cli.cleanup"
local container = require "sandbox.drivers._sealed"
local core = require "sandbox.core"
local installation = require "sandbox.runtime._installation"
local spec_fs = require "spec_fs"

local CLEANUP = "sandbox container cleanup failed; inspect this installation's containers"

local sh, exists = spec_fs.sh, spec_fs.exists

local function tmpdir() return spec_fs.tmpdir("sbx-spec") end

local GONE = "00000000-0000-4000-8000-000000000000:1:1"
local function name(n) return string.format("roundtable-sandbox-%016x-%08x", n, n) end

-- A fake driver: list answers `list` (or raises), remove records the names
-- and fails for those in `fail_remove`.
local function fake_driver(list, o)
  o = o or {}
  local d = { removed = {}, listed = {} }
  function d:list(inst)
    self.listed[#self.listed + 1] = inst
    if o.fail_list then error(CLEANUP, 0) end
    async.sleep(1)
    return list
  end
  function d:remove(n)
    async.sleep(1)
    if o.fail_remove and o.fail_remove[n] then error(CLEANUP, 0) end
    self.removed[#self.removed + 1] = n
  end
  return d
end

describe("installation lock (6.1; 10)", function()
  local dir
  before_each(function() dir = tmpdir() end)
  after_each(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("is exclusive, creates no file and is free again once released", function()
    local a = installation.lock(dir)
    assert.has_error(function() installation.lock(dir) end, "another host process owns these sandbox directories")
    local none, why = installation.try_lock(dir)
    assert.is_nil(none)
    assert.equal("busy", why)
    assert.same({}, core.fs_readdir(dir))
    a:release()
    a:release()   -- idempotent
    local b = installation.lock(dir)
    b:release()
  end)

  it("is seen as busy by another process, and dropped when its holder exits", function()
    local a = installation.lock(dir)
    local lua = arg and arg[-1] or "lua5.4"
    local probe = "flock -n '" .. dir .. "' true && echo free || echo busy"
    assert.equal("busy", sh(probe))
    a:release()
    assert.equal("free", sh(probe))
    assert.truthy(lua)
  end)

  it("is not inherited by children (close-on-exec)", function()
    local a = installation.lock(dir)
    local res = async.run(function()
      return async.await(function(resume)
        core.spawn { file = "/bin/sh", args = { "-c", "ls -l /proc/self/fd/" }, env = {}, on_exit = resume }
      end)
    end)
    a:release()
    assert.equal(0, res.exit_status)
    assert.is_nil(res.stdout:find(dir, 1, true))
  end)

  it("refuses a missing directory with an error, not busy", function()
    local lock, why = installation.try_lock(dir .. "/missing")
    assert.is_nil(lock)
    assert.not_equal("busy", why)
  end)
end)

describe("label values (6.2; 46)", function()
  it("installation id is SHA-256 of workspaceRoot NUL runRoot, stable and root-specific", function()
    local id = installation.id("/srv/work", "/srv/run")
    assert.equal(core.sha256_hex("/srv/work\0/srv/run"), id)
    assert.matches("^%x+$", id)
    assert.equal(64, #id)
    assert.equal(id, installation.id("/srv/work", "/srv/run"))
    assert.not_equal(id, installation.id("/srv/run", "/srv/work"))
    assert.not_equal(id, installation.id("/srv/work2", "/srv/run"))
  end)

  it("owner id names this process: boot id, pid, start ticks", function()
    local owner = installation.owner_id()
    local boot, pid, ticks = owner:match("^(.+):(%d+):(%d+)$")
    assert.equal(36, #boot)
    assert.equal(sh("cat /proc/sys/kernel/random/boot_id"), boot)
    assert.equal(core.getpid(), tonumber(pid))
    local stat = sh("cat /proc/" .. pid .. "/stat")
    assert.equal(stat:match("%)%s+(.*)$"):match("^" .. string.rep("%S+%s+", 19) .. "(%d+)"), ticks)
    assert.is_true(installation.owner_live(owner))
  end)

  it("an owner is gone on another boot, another start time, a dead pid or garbage", function()
    local boot, pid, ticks = installation.owner_id():match("^(.+):(%d+):(%d+)$")
    assert.is_false(installation.owner_live(GONE))
    assert.is_false(installation.owner_live(boot .. ":" .. pid .. ":" .. (tonumber(ticks) + 1)))
    assert.is_false(installation.owner_live(boot .. ":999999999:" .. ticks))
    assert.is_false(installation.owner_live("nonsense"))
    assert.is_false(installation.owner_live(nil))
  end)

  it("start_ticks reads field 22 even when the command name has spaces and parentheses", function()
    local dir = tmpdir()
    local script = dir .. "/a b) c"
    local f = assert(io.open(script, "w"))
    f:write("#!/bin/sh\nsleep 5\n")
    f:close()
    os.execute("chmod 700 '" .. script .. "'")
    local pid = sh("('" .. script .. "' >/dev/null 2>&1 & echo $!)")
    os.execute("sleep 0.2")
    local want = sh("sed 's/.*)//' /proc/" .. pid .. "/stat | awk '{print $20}'")
    assert.equal(want, installation.start_ticks(tonumber(pid)))
    os.execute("kill " .. pid)
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("startup sweep (6.3; 47-49)", function()
  local dir
  before_each(function() dir = tmpdir() end)
  after_each(function() os.execute("rm -rf '" .. dir .. "'") end)

  it("removes only stale containers with a matching name, and leftover turn dirs not in use", function()
    local me = installation.owner_id()
    local d = fake_driver {
      { name = name(1), owner = GONE },
      { name = name(2), owner = me },
      { name = "custom-name", owner = GONE },
      { name = name(3), owner = "" },
    }
    os.execute("mkdir -p '" .. dir .. "/turn-abc123/x' '" .. dir .. "/turn-ACTIVE' '" .. dir .. "/other'")
    local logs = {}
    local n = async.run(function()
      return installation.sweep {
        driver = d, installation = "ab", self = me, run_root = dir,
        active = { ["turn-ACTIVE"] = true },
        log = function(level, msg, fields) logs[#logs + 1] = { level, msg, fields } end,
      }
    end)
    assert.equal(2, n)
    assert.same({ name(1), name(3) }, d.removed)
    assert.same({ "ab" }, d.listed)
    assert.is_false(exists(dir .. "/turn-abc123"))
    assert.is_true(exists(dir .. "/turn-ACTIVE"))
    assert.is_true(exists(dir .. "/other"))
    local seen = {}
    for _, l in ipairs(logs) do seen[l[2]] = l end
    assert.truthy(seen["labelled container with an unexpected name left alone"])
    assert.same({ "info", "removed stale sandbox containers", { count = 2 } },
      seen["removed stale sandbox containers"])
  end)

  it("logs nothing about removals when none were stale", function()
    local me = installation.owner_id()
    local logs = {}
    local n = async.run(function()
      return installation.sweep { driver = fake_driver { { name = name(2), owner = me } }, installation = "ab",
        self = me, log = function(_, msg) logs[#logs + 1] = msg end }
    end)
    assert.equal(0, n)
    assert.same({}, logs)
  end)

  it("a failed list is the cleanup error, logged once", function()
    local logs = {}
    local ok, err = pcall(async.run, function()
      return installation.sweep { driver = fake_driver({}, { fail_list = true }), installation = "ab",
        self = "x", log = function(level, msg) logs[#logs + 1] = level .. ":" .. msg end }
    end)
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.same({ "error:stale sandbox containers could not be removed; run sbx cleanup" }, logs)
  end)

  it("a failed list with the daemon down is the daemon's error, with no cleanup line", function()
    local logs = {}
    local ok, err = pcall(async.run, function()
      return installation.sweep { driver = fake_driver({}, { fail_list = true }), installation = "ab",
        self = "x", log = function(level, msg) logs[#logs + 1] = level .. ":" .. msg end,
        daemon_down = function() return true end }
    end)
    assert.is_false(ok)
    assert.equal(require("sandbox.errors").DAEMON, err)
    assert.same({}, logs)
  end)

  it("a failed removal still tries the others, then raises the cleanup error", function()
    local d = fake_driver({ { name = name(1), owner = GONE }, { name = name(2), owner = GONE } },
      { fail_remove = { [name(1)] = true } })
    local ok, err = pcall(async.run, function()
      return installation.sweep { driver = d, installation = "ab", self = "me", log = function() end }
    end)
    assert.is_false(ok)
    assert.equal(CLEANUP, err)
    assert.same({ name(2) }, d.removed)
  end)
end)

describe("sbx cleanup (6.4; 50)", function()
  local root, run_root, ws_root
  before_each(function()
    root = tmpdir()
    run_root, ws_root = root .. "/run", root .. "/work"
    os.execute("mkdir -p '" .. run_root .. "/turn-abc123' '" .. ws_root .. "'")
  end)
  after_each(function() os.execute("rm -rf '" .. root .. "'") end)

  local function list()
    return {
      { name = name(1), owner = GONE },
      { name = name(2), owner = installation.owner_id() },
    }
  end

  local function run_cleanup(d, force)
    local lines = {}
    local status = async.run(function()
      return cleanup.cleanup({ runRoot = run_root, workspaceRoot = ws_root, driver = d }, force,
        function(l) lines[#lines + 1] = l end)
    end)
    return status, lines
  end

  it("with the lock free and --force removes every labelled container and the turn dirs", function()
    local d = fake_driver(list())
    local status, lines = run_cleanup(d, true)
    assert.equal(0, status)
    assert.same({ name(1), name(2) }, d.removed)
    assert.same({ name(1) .. " stale removed", name(2) .. " stale removed" }, lines)
    assert.same({ installation.id(ws_root, run_root) }, d.listed)
    assert.is_false(exists(run_root .. "/turn-abc123"))
    -- the lock was released
    installation.lock(run_root):release()
  end)

  it("with the lock held by a live host removes only containers whose owner is gone", function()
    local held = installation.lock(run_root)
    local d = fake_driver(list())
    local status, lines = run_cleanup(d, true)
    held:release()
    assert.equal(0, status)
    assert.same({ name(1) }, d.removed)
    assert.same({ name(1) .. " stale removed", name(2) .. " in use kept" }, lines)
    assert.is_true(exists(run_root .. "/turn-abc123"))
  end)

  it("without --force removes nothing and says to rerun with --force", function()
    local d = fake_driver(list())
    local status, lines = run_cleanup(d, false)
    assert.equal(0, status)
    assert.same({}, d.removed)
    assert.same({ name(1) .. " stale kept", name(2) .. " stale kept",
      "rerun with --force to remove the stale containers" }, lines)
    assert.is_true(exists(run_root .. "/turn-abc123"))
  end)

  it("exits 1 when a removal failed", function()
    local d = fake_driver(list(), { fail_remove = { [name(2)] = true } })
    local status, lines = run_cleanup(d, true)
    assert.equal(1, status)
    assert.same({ name(1) .. " stale removed", name(2) .. " stale failed" }, lines)
  end)

  it("names are checked with the 4.4 pattern", function()
    assert.is_true(container.name_valid(name(1)))
    assert.is_false(container.name_valid("roundtable-sandbox-0123456789ABCDEF-01234567"))
  end)
end)
