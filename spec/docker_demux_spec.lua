-- docker_demux_spec.lua: core.docker_demux, Docker's framed log stream read
-- back as text (spec/rich-mode.md 5.4; behaviour 18; fuzzed by
-- fuzz/demux_fuzz.c).
local core = require "sandbox.core"

local function frame(stream, payload)
  return string.char(stream, 0, 0, 0) .. string.pack(">I4", #payload) .. payload
end

describe("core.docker_demux (rich-mode.md 5.4)", function()
  it("joins stdout and stderr payloads in order (item 18)", function()
    local buf = frame(1, "line one\n") .. frame(2, "warn: two\n") .. frame(1, "three\n") .. frame(0, "")
    assert.are.equal("line one\nwarn: two\nthree\n", core.docker_demux(buf))
  end)

  it("returns plain text unchanged (item 18)", function()
    assert.are.equal("plain log line\nanother\n", core.docker_demux("plain log line\nanother\n"))
    assert.are.equal("", core.docker_demux(""))
  end)

  it("returns the whole buffer when any header is invalid", function()
    local bad = frame(1, "ok\n") .. string.char(3, 0, 0, 0, 0, 0, 0, 1) .. "x"
    assert.are.equal(bad, core.docker_demux(bad))
    local pad = frame(1, "ok\n") .. string.char(1, 0, 1, 0, 0, 0, 0, 1) .. "x"
    assert.are.equal(pad, core.docker_demux(pad))
  end)

  it("returns the whole buffer when no frame is complete, and drops a cut-off last frame", function()
    local cut = string.char(1, 0, 0, 0, 0, 0, 0, 20) .. "short"
    assert.are.equal(cut, core.docker_demux(cut))
    assert.are.equal("a\n", core.docker_demux(frame(1, "a\n") .. cut))
    assert.are.equal("a\n", core.docker_demux(frame(1, "a\n") .. string.char(2, 0)))
  end)
end)
