-- anthropic_upstream.lua: starts spec/fixtures/anthropic_sse_upstream.mjs (an
-- Anthropic-shaped Messages API upstream written from the public reference)
-- as a bun process for the Lua specs, and drives its control routes.
--
--   local up = require("anthropic_upstream").start()
--   up.url                          http://127.0.0.1:PORT
--   up:push{ reply, ... }           (inside a task) replies taken in order
--   up:reset() / up:release()       (inside a task)
--   up:log() -> the recorded requests {method, path, search, headers, body}
--   up:stop()
-- Reply builders (the fixture's shapes): M.sse_text(text), M.sse(events)
local async = require "sandbox.async"
local core = require "sandbox.core"
local json = require "sandbox.json"

local M = {}

local Up = {}
Up.__index = Up

local function post(url, body)
  return async.await(function(resume)
    core.http_post { url = url, headers = { "Content-Type: application/json" }, body = body or "{}",
      allow_http = true, timeout_ms = 10000, max_body = 64 * 1024 * 1024, on_done = resume }
  end)
end

function Up:push(list) return post(self.url .. "/__push", json.encode(json.jsonable(list))) end
function Up:reset() return post(self.url .. "/__reset") end
function Up:release() return post(self.url .. "/__release") end

function Up:log()
  local res = post(self.url .. "/__log")
  assert(res.ok, "log request failed")
  return json.plain(json.decode(res.body))
end

function Up:messages()
  local out = {}
  for _, r in ipairs(self:log()) do
    if r.path == "/v1/messages" or r.path == "/v1/messages/count_tokens" then out[#out + 1] = r end
  end
  return out
end

function Up:stop()
  if self.stopped then return end
  self.stopped = true
  os.execute("kill " .. self.pid .. " 2>/dev/null")
  if self.pipe then pcall(self.pipe.close, self.pipe) end
end

function M.start()
  local parent = require("spec_fs").own_pid()
  local cmd = string.format("exec env -u LD_PRELOAD bun spec/fixtures/anthropic_sse_upstream.mjs --parent-pid %d </dev/null &", parent or 0)
  local pipe = assert(io.popen(cmd, "r"))
  local line = pipe:read("l")
  assert(line, "anthropic_sse_upstream.mjs printed nothing")
  local port = assert(tonumber(line:match('"port"%s*:%s*(%d+)')), line)
  local pid = assert(tonumber(line:match('"pid"%s*:%s*(%d+)')), line)
  return setmetatable({ port = port, pid = pid, pipe = pipe, url = "http://127.0.0.1:" .. port }, Up)
end

-- The SSE events of one streamed text message, as the fixture's message().
function M.sse_text(text, model)
  model = model or "claude-sonnet-4-6"
  local ev = {
    { type = "message_start", message = { id = "msg_1", type = "message", role = "assistant", model = model,
      content = json.array(), stop_reason = json.null, stop_sequence = json.null, usage = { input_tokens = 3, output_tokens = 1 } } },
    { type = "content_block_start", index = 0, content_block = { type = "text", text = "" } },
    { type = "content_block_delta", index = 0, delta = { type = "text_delta", text = text } },
    { type = "content_block_stop", index = 0 },
    { type = "message_delta", delta = { stop_reason = "end_turn", stop_sequence = json.null }, usage = { output_tokens = 2 } },
    { type = "message_stop" },
  }
  return { events = ev }
end

-- The SSE events of one streamed tool_use message (stop_reason tool_use).
function M.sse_tool(name, input, id, model)
  local ev = {
    { type = "message_start", message = { id = "msg_t", type = "message", role = "assistant", model = model or "claude-sonnet-4-6",
      content = json.array(), stop_reason = json.null, stop_sequence = json.null, usage = { input_tokens = 3, output_tokens = 1 } } },
    { type = "content_block_start", index = 0, content_block = { type = "tool_use", id = id or "toolu_spec_1", name = name, input = json.object({}, {}) } },
    { type = "content_block_delta", index = 0, delta = { type = "input_json_delta", partial_json = json.encode(json.jsonable(input)) } },
    { type = "content_block_stop", index = 0 },
    { type = "message_delta", delta = { stop_reason = "tool_use", stop_sequence = json.null }, usage = { output_tokens = 2 } },
    { type = "message_stop" },
  }
  return { events = ev }
end

-- Raw SSE text of events.
function M.sse(events)
  local out = {}
  for _, e in ipairs(events) do
    out[#out + 1] = "event: " .. e.type .. "\ndata: " .. json.encode(json.jsonable(e)) .. "\n\n"
  end
  return table.concat(out)
end

return M
