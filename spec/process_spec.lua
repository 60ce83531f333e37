-- process_spec.lua: core.spawn and core.lock_dir (core/process.c;
-- spec/runtime.md 4.5-4.6).
local async = require "sandbox.async"
local core = require "sandbox.core"

local function spawn(opts)
  return async.run(function()
    return async.await(function(resume)
      opts.on_exit = resume
      opts.proc = core.spawn(opts)
      if opts.after then opts.after(opts.proc) end
    end)
  end)
end

describe("core.spawn", function()
  it("gives the child exactly the environment given, nothing inherited", function()
    local res = spawn { file = "/usr/bin/env", env = { "A=1", "B=two words" } }
    assert.equal(0, res.exit_status)
    assert.equal("A=1\nB=two words\n", res.stdout)
    res = spawn { file = "/usr/bin/env", env = {} }
    assert.equal("", res.stdout)
  end)

  it("passes args as separate elements, unexpanded", function()
    local res = spawn { file = "/bin/sh", args = { "-c", 'printf "%s|" "$@"', "sh", "a b", "$HOME", "*", "" }, env = {} }
    assert.equal("a b|$HOME|*||", res.stdout)
  end)

  it("writes stdin then closes it", function()
    local big = string.rep("0123456789", 50000)
    local res = spawn { file = "/bin/cat", env = {}, stdin = big }
    assert.equal(big, res.stdout)
    res = spawn { file = "/bin/cat", env = {} }
    assert.equal("", res.stdout)
  end)

  it("does not die of SIGPIPE when the child never reads stdin", function()
    local res = spawn { file = "/bin/true", env = {}, stdin = string.rep("x", 4 * 1024 * 1024) }
    assert.equal(0, res.exit_status)
  end)

  it("reads stdout and stderr at once with no pipe deadlock", function()
    local res = spawn { file = "/bin/sh", args = { "-c", "head -c 300000 /dev/zero >&2; head -c 300000 /dev/zero; exit 7" },
      env = {}, max_stdout = 300000, max_stderr = 300000 }
    assert.equal(7, res.exit_status)
    assert.equal(300000, #res.stdout)
    assert.equal(300000, #res.stderr)
    assert.is_false(res.stdout_truncated)
    assert.is_false(res.stderr_truncated)
  end)

  it("stops reading beyond a cap and records truncated", function()
    local res = spawn { file = "/bin/sh", args = { "-c", "head -c 1001 /dev/zero; echo done >&2" },
      env = {}, max_stdout = 1000 }
    assert.equal(1000, #res.stdout)
    assert.is_true(res.stdout_truncated)
    assert.is_false(res.stderr_truncated)
  end)

  it("kill_on_overflow SIGKILLs a chatty child at the cap", function()
    local res = spawn { file = "/usr/bin/yes", env = {}, max_stdout = 65536, kill_on_overflow = true }
    assert.is_true(res.stdout_truncated)
    assert.equal(65536, #res.stdout)
    assert.equal(9, res.term_signal)
  end)

  it("reports a signal death and kill() returns false once the child is gone", function()
    local proc
    local res = spawn { file = "/bin/sleep", args = { "30" }, env = {},
      after = function(p) proc = p; assert.is_true(p:kill(core.SIGKILL)) end }
    assert.equal(9, res.term_signal)
    assert.is_false(proc:kill(core.SIGKILL))
  end)

  it("reports a spawn failure as res.error on a later loop turn", function()
    local sync = true
    local res = async.run(function()
      local r = async.await(function(resume)
        core.spawn { file = "/nonexistent/docker", env = {}, on_exit = function(r) assert.is_false(sync); resume(r) end }
        sync = false
      end)
      return r
    end)
    assert.equal("cannot start /nonexistent/docker: no such file or directory", res.error)
    assert.equal("ENOENT", res.code)
  end)

  it("finds the file on the child's PATH", function()
    local res = spawn { file = "true", env = { "PATH=/usr/bin:/bin" } }
    assert.equal(0, res.exit_status)
    res = spawn { file = "true", env = { "PATH=/nonexistent" } }
    assert.equal("ENOENT", res.code)
  end)

  it("the child inherits no descriptor beyond 0-2, even ones Lua opened", function()
    local f = assert(io.open("/etc/hostname", "r"))
    local res = spawn { file = "/bin/sh", args = { "-c", "ls /proc/$$/fd" }, env = {} }
    f:close()
    local fds = {}
    for n in res.stdout:gmatch("%d+") do fds[#fds + 1] = tonumber(n) end
    table.sort(fds)
    -- 0-2, plus the descriptor ls itself uses for the directory listing, if any
    assert.same({ 0, 1, 2 }, { fds[1], fds[2], fds[3] })
    assert.is_true(#fds <= 4, res.stdout)
  end)

  it("keeps running and reports when its userdata is dropped", function()
    local res = async.run(function()
      return async.await(function(resume)
        core.spawn { file = "/bin/echo", args = { "hi" }, env = {}, on_exit = resume }
        collectgarbage()
        collectgarbage()
      end)
    end)
    assert.equal("hi\n", res.stdout)
  end)

  it("leaves nothing active on the loop after exit", function()
    spawn { file = "/bin/true", env = {} }
    assert.is_false(core.run("nowait"))
  end)

  it("raises on wrong arguments", function()
    assert.has_error(function() core.spawn { file = "/bin/true", env = {} } end)   -- no on_exit
    assert.has_error(function() core.spawn { file = "/bin/true", env = { "A\0B" }, on_exit = print } end)
    assert.has_error(function() core.spawn { args = {}, on_exit = print } end)
  end)
end)

describe("core.lock_dir", function()
  it("locks a directory exclusively and reports another holder as EAGAIN", function()
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -m 700 '" .. dir .. "'")
    local a = assert(core.lock_dir(dir))
    assert.is_true(a:held())
    local b, msg, code = core.lock_dir(dir)
    assert.is_nil(b)
    assert.equal("EAGAIN", code)
    assert.equal("EAGAIN: held by another process", msg)
    a:release()
    assert.is_false(a:held())
    local c = assert(core.lock_dir(dir))
    c:release()
    local _, _, enoent = core.lock_dir(dir .. "/missing")
    assert.equal("ENOENT", enoent)
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)
