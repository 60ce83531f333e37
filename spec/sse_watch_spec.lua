-- sse_watch_spec.lua: core.sse_watch, the SSE error-event side watch of
-- spec/rich-mode.md 11.5 (behaviour 75 at the core's level; the event
-- cutter is fuzzed against a reference by fuzz/sse_fuzz.c).
local core = require "sandbox.core"

local function event(name, data)
  return (name and ("event: " .. name .. "\n") or "") .. "data: " .. data .. "\n\n"
end

-- Pushes chunks; returns every non-nil report with its chunk index.
local function watch(chunks)
  local w, out = core.sse_watch(), {}
  for i, c in ipairs(chunks) do
    local r = w:push(c)
    if r ~= nil then out[#out + 1] = { i, r } end
  end
  return out
end

local ERR = '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'

describe("core.sse_watch (rich-mode.md 11.5)", function()
  it("reports an error event split across chunks once, where it completes (item 75)", function()
    local s = event("message_start", '{"type":"message_start"}') .. event("error", ERR)
      .. event("error", '{"type":"error","again":true}')
    for cut = 1, #s - 1 do
      local got = watch({ s:sub(1, cut), s:sub(cut + 1) })
      assert.are.equal(1, #got, "cut at " .. cut)
      assert.are.equal(ERR, got[1][2])
      local ends = #event("message_start", '{"type":"message_start"}') + #event("error", ERR)
      assert.are.equal(cut >= ends and 1 or 2, got[1][1])
    end
  end)

  it("reports a JSON object of type error without an event name, and ignores others", function()
    assert.are.same({}, watch({ event("message_delta", '{"type":"message_delta","error":1}'),
      event(nil, '{"type":"errors"}'), event(nil, '["error"]'), event(nil, "error") }))
    assert.are.same({ { 1, ERR } }, watch({ event(nil, ERR) }))
    assert.are.same({ { 1, '{"type":"\\u0065rror"}' } }, watch({ event(nil, '{"type":"\\u0065rror"}') }))
    assert.are.same({ { 1, "not json" } }, watch({ event("error", "not json") }))
  end)

  it("cuts at \\r\\n blank lines, drops one leading space and joins data lines with \\n", function()
    local s = "event:error\r\ndata:  two spaces\r\ndata:b\r\ndata\r\n\r\n"
    assert.are.same({ { 1, " two spaces\nb\n" } }, watch({ s }))
  end)

  it("throws away an unfinished event over 64 KiB, then still sees the next one", function()
    local big = "data: " .. ("x"):rep(core.limits.SSE_MAX_EVENT_BYTES) .. "\n"
    local chunks = {}
    for i = 1, #big, 1000 do chunks[#chunks + 1] = big:sub(i, i + 999) end
    chunks[#chunks + 1] = "event: error\ndata: hidden in the big event\n\n"
    chunks[#chunks + 1] = event("error", ERR)
    local got = watch(chunks)
    assert.are.equal(1, #got)
    assert.are.equal(ERR, got[1][2])
    -- an event of exactly the bound is kept
    local edge = "event: error\ndata: "
    edge = edge .. ("y"):rep(core.limits.SSE_MAX_EVENT_BYTES - #edge - 1) .. "\n\n"
    assert.are.equal(1, #watch({ edge }))
  end)

  it("passes nothing on: the worker's bytes are the caller's", function()
    local w = core.sse_watch()
    assert.is_nil(w:push(event("ping", "{}")))
    assert.is_nil(w:push(""))
  end)
end)
