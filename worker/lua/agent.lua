-- agent.lua: the bounded Chat Completions tool loop (spec/worker.md 5.3-5.6).
--
-- The broker function may yield (the offline specs run the loop inside a
-- coroutine against a real broker): nothing here calls it from a metamethod,
-- an iterator or a sort comparator.
local codec = require "codec"
local text = require "text"
local budget = require "budget"

local M = {}

M.MAX_STEPS = 12
M.MAX_CALLS = 8
M.MAX_ID_CHARS = 128
M.MAX_FINAL_CHARS = 100000
M.ASSISTANT_BUDGET = 4096
M.RESULT_BUDGET = 4096
M.ARGUMENTS_BUDGET = 2048
M.REFUSAL = "Tool call refused or failed."
M.OMITTED = '{"omitted":"Invalid or large arguments omitted from context."}'

local obj, arr = codec.object, codec.array

local function fail(message)
  error(message, 0)
end

-- The reply's message object (5.3 step 3), or fails.
local function reply_message(reply)
  local choices = codec.is_object(reply) and reply.choices
  local first = codec.is_array(choices) and choices[1]
  local message = codec.is_object(first) and first.message
  if not codec.is_object(message) then fail("invalid model response") end
  return message
end

-- A call id for position index (zero-based) of step (5.4).
local function call_id(call, step, index, used)
  local id = codec.is_object(call) and call.id
  if type(id) == "string" then
    local n = text.len(id)
    if n and n >= 1 and n <= M.MAX_ID_CHARS and not used[id] then
      used[id] = true
      return id
    end
  end
  local base = "call_" .. step .. "_" .. index
  local candidate, k = base, 0
  while used[candidate] do
    k = k + 1
    candidate = base .. "_" .. k
  end
  used[candidate] = true
  return candidate
end

-- normalize(call, step, index, used, registry) -> {id, name, arguments (the
-- provider's raw value), replay (the call object replayed to the model)}.
function M.normalize(call, step, index, used, registry)
  local fn = codec.is_object(call) and codec.is_object(call["function"]) and call["function"] or nil
  local id = call_id(call, step, index, used)
  local name = fn and fn.name
  if not (type(name) == "string" and #name <= 64 and name:match("^[a-z][a-z0-9_]*$")
          and registry.by_name[name]) then
    name = "invalid_tool"
  end
  local raw = fn and fn.arguments
  local replayed = M.OMITTED
  if type(raw) == "string" and text.measure(raw) <= M.ARGUMENTS_BUDGET then replayed = raw end
  return {
    id = id,
    name = name,
    arguments = raw,
    replay = obj({ "id", "type", "function" }, {
      id = id, type = "function",
      ["function"] = obj({ "name", "arguments" }, { name = name, arguments = replayed }),
    }),
  }
end

-- Runs one normalized call (5.5): the result text, or the refusal text.
local function run_call(call, registry)
  local entry = registry.by_name[call.name]
  if not entry or type(call.arguments) ~= "string" then return M.REFUSAL end
  local args = codec.decode(call.arguments)
  if not codec.is_object(args) then return M.REFUSAL end
  local result = entry.run(args)
  if type(result) ~= "string" then return M.REFUSAL end
  return result
end

-- The final answer text (5.6), or fails.
local function final_text(message)
  local content = message.content
  if type(content) ~= "string" then fail("model returned no final text") end
  local n = text.len(content)
  local trimmed = text.trim(content)
  if not n or n > M.MAX_FINAL_CHARS or trimmed == "" then fail("model returned no final text") end
  return trimmed
end

-- run(ctx) -> "final", text | "limit"
--   ctx.model, ctx.messages (array: system, history..., user), ctx.user_msg,
--   ctx.registry, ctx.call (route, body) -> decoded 200 body | nil, error.
function M.run(ctx)
  local payload = obj({ "model", "messages", "tools" },
                      { model = ctx.model, messages = ctx.messages, tools = ctx.registry.tools })
  local used = {}
  for step = 0, M.MAX_STEPS - 1 do
    local body, err = budget.fit(payload, ctx.user_msg)
    if not body then fail(err) end
    local reply, cerr = ctx.call("/model", body)
    if reply == nil then fail(cerr or "broker refused") end
    local message = reply_message(reply)
    local calls = message.tool_calls
    if not codec.is_array(calls) or #calls == 0 then
      return "final", final_text(message)
    end
    if #calls > M.MAX_CALLS then fail("too many tool calls") end
    if step == M.MAX_STEPS - 1 then return "limit" end
    local normalized, replay = {}, arr()
    for i = 1, #calls do
      normalized[i] = M.normalize(calls[i], step, i - 1, used, ctx.registry)
      replay[i] = normalized[i].replay
    end
    local content = type(message.content) == "string"
      and text.prompt_text(message.content, M.ASSISTANT_BUDGET) or ""
    ctx.messages[#ctx.messages + 1] = obj({ "role", "content", "tool_calls" },
      { role = "assistant", content = content, tool_calls = replay })
    for i = 1, #normalized do
      local result = run_call(normalized[i], ctx.registry)
      ctx.messages[#ctx.messages + 1] = obj({ "role", "tool_call_id", "content" }, {
        role = "tool", tool_call_id = normalized[i].id,
        content = text.prompt_text(result, M.RESULT_BUDGET),
      })
    end
  end
  return "limit"
end

return M
