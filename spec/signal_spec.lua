-- signal_spec.lua: cancellation signals as host callbacks see them in
-- ctx.signal (lua/sandbox/signal.lua; spec/runtime.md 1 "Cancellation").
local signal = require "sandbox.signal"

describe("a signal", function()
  it("aborts once, with a reason ('aborted' by default), and calls each handler once", function()
    local s, seen = signal.new(), {}
    assert.is_false(s.aborted)
    s:on_abort(function(r) seen[#seen + 1] = r end)
    assert.is_true(s:abort())
    assert.is_false(s:abort("again"))
    assert.is_true(s.aborted)
    assert.equal("aborted", s.reason)
    assert.same({ "aborted" }, seen)
  end)

  it("calls a handler registered after the abort at once; a removed handler never", function()
    local s, calls = signal.new(), 0
    local remove = s:on_abort(function() calls = calls + 1 end)
    remove()
    s:abort("turn ended")
    assert.equal(0, calls)
    local r
    s:on_abort(function(reason) r = reason end)
    assert.equal("turn ended", r)
  end)

  it("keeps aborting the other handlers when one raises", function()
    local s, later = signal.new(), false
    s:on_abort(function() error("bad handler") end)
    s:on_abort(function() later = true end)
    s:abort("x")
    assert.is_true(later)
  end)

  it("throw_if_aborted raises signal.AbortError only once aborted", function()
    local s = signal.new()
    s:throw_if_aborted()
    s:abort("deadline")
    local ok, err = pcall(s.throw_if_aborted, s)
    assert.is_false(ok)
    assert.equal(signal.AbortError, err)
    assert.equal("aborted", tostring(err))
  end)

  it("a child aborts with its parent (with the parent's reason) or alone; detach cuts the link", function()
    local parent = signal.new()
    local child = signal.child(parent)
    parent:abort("turn ended")
    assert.is_true(child.aborted)
    assert.equal("turn ended", child.reason)

    parent = signal.new()
    child = signal.child(parent)
    child:abort("call deadline")
    assert.is_false(parent.aborted)

    parent = signal.new()
    child = signal.child(parent)
    child:detach()
    parent:abort("x")
    assert.is_false(child.aborted)
    assert.is_false(signal.child(nil).aborted)
  end)
end)
