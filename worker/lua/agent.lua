-- agent.lua: the bounded Chat Completions tool loop (spec/worker.md 5.3-5.6,
-- as spec/providers.md 2-3 amends them for real providers).
--
-- Reading a reply: the text is `content` when it is a string, or the `text`
-- members of its `type: "text"` parts joined in order (Mistral's content
-- arrays; thinking, reasoning and image parts are ignored); with no text, a
-- non-empty `refusal` is the answer (OpenAI's refusals). The first choice's
-- finish_reason "length" marks a delivered text as cut (text.CUT_MARKER,
-- not the memory marker, and truncated = true); "content_filter" without text fails with
-- `model output was filtered`. Tool calls whose `arguments` is absent, null
-- or "" run as {} (OpenRouter's zero-argument calls).
--
-- Replaying a tool step within the turn keeps the provider state a provider
-- needs back on its next call, bounded and never cut: the assistant's
-- `reasoning_content` / `reasoning` strings (at most 65,536 bytes encoded;
-- DeepSeek's thinking mode answers 400 without them) and each call's
-- `extra_content` object (at most 16,384 bytes encoded; Gemini 3's thought
-- signatures). One over its bound is dropped whole. None of it reaches
-- history.json. A tool-only assistant message is replayed with content null.
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
M.MAX_REASONING_BYTES = 65536
M.MAX_EXTRA_CONTENT_BYTES = 16384
M.NO_ARGUMENTS = "{}"

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
  -- providers.md 3: no arguments at all (absent, null, "") is the empty object
  if fn and (raw == nil or raw == codec.null or raw == "") then raw = M.NO_ARGUMENTS end
  local replayed = M.OMITTED
  if type(raw) == "string" and text.measure(raw) <= M.ARGUMENTS_BUDGET then replayed = raw end
  -- providers.md 2: the call's opaque provider state, kept within its bound
  local extra = codec.is_object(call) and call.extra_content or nil
  if not (codec.is_object(extra) and #codec.encode(extra) <= M.MAX_EXTRA_CONTENT_BYTES) then extra = nil end
  return {
    id = id,
    name = name,
    arguments = raw,
    replay = obj({ "id", "type", "function", "extra_content" }, {
      id = id, type = "function",
      ["function"] = obj({ "name", "arguments" }, { name = name, arguments = replayed }),
      extra_content = extra,
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

-- The text of a message's content (providers.md 3): the string itself, or
-- the text parts of an array joined in order; nil when it holds none.
function M.content_text(content)
  if type(content) == "string" then return content end
  if not codec.is_array(content) then return nil end
  local parts, any = {}, false
  for i = 1, #content do
    local part = content[i]
    if codec.is_object(part) and part.type == "text" and type(part.text) == "string" then
      parts[#parts + 1] = part.text
      any = true
    end
  end
  return any and table.concat(parts) or nil
end

-- The first choice's finish_reason, or nil.
local function finish_reason(reply)
  local first = reply.choices[1]
  return type(first.finish_reason) == "string" and first.finish_reason or nil
end

-- The final answer (5.6; providers.md 3): text, truncated; or fails.
local function final_text(message, finish)
  local content = M.content_text(message.content)
  local trimmed = content and text.trim(content) or ""
  if trimmed == "" and type(message.refusal) == "string" and text.trim(message.refusal) ~= "" then
    content = message.refusal
    trimmed = text.trim(content)
  end
  if trimmed == "" then
    if finish == "content_filter" then fail("model output was filtered") end
    fail("model returned no final text")
  end
  local n = text.len(content)
  if not n or n > M.MAX_FINAL_CHARS then fail("model returned no final text") end
  if finish == "length" then
    -- cut by the provider: say so, within the reply's character bound
    local room = M.MAX_FINAL_CHARS - text.len(text.CUT_MARKER)
    if text.len(trimmed) > room then trimmed = text.trim(text.prefix_chars(trimmed, room)) end
    return trimmed .. text.CUT_MARKER, true
  end
  return trimmed, false
end

-- A replayed reasoning member: the provider's string within its bound, or nil.
local function reasoning(v)
  if type(v) ~= "string" then return nil end
  local n = text.measure_or_nil(v)
  if not n or n > M.MAX_REASONING_BYTES then return nil end
  return v
end

-- run(ctx) -> "final", text, truncated | "limit"
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
      return "final", final_text(message, finish_reason(reply))
    end
    if #calls > M.MAX_CALLS then fail("too many tool calls") end
    if step == M.MAX_STEPS - 1 then return "limit" end
    local normalized, replay = {}, arr()
    for i = 1, #calls do
      normalized[i] = M.normalize(calls[i], step, i - 1, used, ctx.registry)
      replay[i] = normalized[i].replay
    end
    -- providers.md 2: null (not "") for a tool-only message; the provider's
    -- reasoning within its bound, for the next call of this turn only
    local said = M.content_text(message.content)
    local content = (said and said ~= "") and text.prompt_text(said, M.ASSISTANT_BUDGET) or codec.null
    ctx.messages[#ctx.messages + 1] = obj({ "role", "content", "reasoning_content", "reasoning", "tool_calls" }, {
      role = "assistant", content = content,
      reasoning_content = reasoning(message.reasoning_content), reasoning = reasoning(message.reasoning),
      tool_calls = replay,
    })
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
