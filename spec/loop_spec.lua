-- loop_spec.lua: core.run, core.timer and core.on_signal (core/loop.c) and
-- the async layer on top (lua/sandbox/async.lua). Run under ASan by make
-- check, so a watcher reaching freed memory fails here.
local async = require "sandbox.async"
local core = require "sandbox.core"

describe("core.timer", function()
  it("fires once after its delay", function()
    local fired = 0
    async.run(function()
      core.timer(5, function() fired = fired + 1 end)
      async.sleep(30)
    end)
    assert.equal(1, fired)
  end)

  it("never fires once stopped, and a second stop is harmless", function()
    local fired = false
    async.run(function()
      local t = core.timer(10, function() fired = true end)
      t:stop()
      t:stop()
      async.sleep(30)
    end)
    assert.is_false(fired)
  end)

  it("can be stopped after it fired (its watcher is gone by then)", function()
    async.run(function()
      local t = core.timer(1, function() end)
      async.sleep(20)
      collectgarbage()
      t:stop()
      t:stop()
    end)
  end)

  it("keeps running when its Lua object is collected", function()
    local fired = false
    async.run(function()
      core.timer(10, function() fired = true end)
      collectgarbage(); collectgarbage()
      async.sleep(40)
    end)
    assert.is_true(fired)
  end)
end)

describe("core.on_signal", function()
  it("delivers a signal to the loop until stopped", function()
    local got = {}
    async.run(function()
      local w = core.on_signal(core.SIGTERM, function(n) got[#got + 1] = n end)
      os.execute("kill -TERM " .. core.getpid())
      for _ = 1, 100 do if #got > 0 then break end; async.sleep(5) end
      w:stop()
      w:stop()
    end)
    assert.same({ core.SIGTERM }, got)
  end)
end)

describe("core.run", function()
  -- uv_run is not reentrant: a nested run runs close callbacks that free
  -- handles the outer libuv frame still reads when the callback returns.
  it("refuses to re-enter the running loop from a callback or a task", function()
    local from_cb, from_task
    async.run(function()
      async.await(function(resume)
        core.timer(0, function()
          from_cb = table.pack(pcall(core.run, "nowait"))
          resume()
        end)
      end)
      from_task = table.pack(pcall(core.run, "nowait"))   -- resumed from that callback
    end)
    assert.is_false(from_cb[1])
    assert.matches("already running", from_cb[2])
    assert.is_false(from_task[1])
    assert.matches("already running", from_task[2])
    assert.is_boolean(core.run("nowait"))                 -- outside the loop it runs again
  end)
end)

describe("async", function()
  it("run returns the task's results and raises its error", function()
    assert.same({ 1, 2 }, { async.run(function() async.sleep(1); return 1, 2 end) })
    assert.has_error(function() async.run(function() error("boom", 0) end) end, "boom")
  end)

  it("await accepts a synchronous resume and ignores later ones", function()
    local v = async.run(function()
      return async.await(function(resume) resume("first"); resume("second") end)
    end)
    assert.equal("first", v)
  end)

  it("refuses a task that waits on nothing instead of hanging", function()
    assert.has_error(function() async.run(function() async.await(function() end) end) end)
  end)

  describe("wait_or_abort (a task or the signal, whichever is first)", function()
    local signal = require "sandbox.signal"

    it("returns true once the task finished, and drops its abort hook", function()
      local sig = signal.new()
      local done = async.run(function()
        local t = async.spawn(function() async.sleep(5) return "x" end)
        return async.wait_or_abort(t, sig)
      end)
      assert.is_true(done)
      for _, h in ipairs(sig._handlers) do assert.is_nil(h.fn) end   -- no live hook on a long-lived signal
    end)

    it("returns false when the signal aborts first; the task keeps running", function()
      local sig = signal.new()
      local finished = false
      local done, still = async.run(function()
        local t = async.spawn(function() async.sleep(50) finished = true end)
        core.timer(5, function() sig:abort("stop") end)
        local d = async.wait_or_abort(t, sig)
        local running = not t.done
        async.wait(t)
        return d, running
      end)
      assert.is_false(done)
      assert.is_true(still)
      assert.is_true(finished)
    end)

    it("does not wait when the task is done or the signal already aborted", function()
      local sig = signal.new()
      assert.is_true(async.run(function() return async.wait_or_abort(async.spawn(function() end), sig) end))
      sig:abort()
      assert.is_false(async.run(function()
        local t = async.spawn(function() async.sleep(5) end)
        local d = async.wait_or_abort(t, sig)
        async.wait(t)
        return d
      end))
    end)
  end)
end)
