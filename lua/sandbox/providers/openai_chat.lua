-- providers/openai_chat.lua: the OpenAI Chat Completions wire format
-- (spec/broker.md 9.1-9.8 as spec/providers.md 1-2 amend them), the one
-- place that knows its fields. The sealed broker, `sbx doctor --probe`, the
-- failure reasons and the metrics read the facts this module returns, never
-- the wire members themselves.
--
--   openai_chat.rebuild(body, model, max_tokens[, field]) -> forced | nil, REFUSED
--       The guest's body is never forwarded: a new body is built from the
--       members that passed, in a fixed order, with the configured model and
--       the forced output-token cap in the configured member. Anything
--       unexpected refuses the whole request (400 before any credential or
--       upstream contact).
--   openai_chat.reply_facts(value) -> {message=bool, finish=, tool_calls=bool, usage=}
--       what ops/reason.lua checks a worker's reason against (never text),
--       and the call's token usage (M.usage)
--   openai_chat.usage(value) -> {input=, output=, cached=, reasoning=} | nil
--       the provider's `usage` counts: prompt_tokens, completion_tokens,
--       prompt_tokens_details.cached_tokens (OpenAI, Azure, Gemini, xAI;
--       DeepSeek's prompt_cache_hit_tokens), completion_tokens_details.
--       reasoning_tokens; each a non-negative integer, absent when the
--       provider does not report it
--   openai_chat.auth_headers(modelAuth, key) -> {"Name: value", ...}
--   openai_chat.error_tokens(body, filter) -> {code=, type=, param=}
--       (providers/_error_body.lua: the operator's tokens of an error body)
--
-- Provider state a turn must send back is kept bounded, typed and rebuilt:
-- an assistant's `reasoning_content` and `reasoning` (strings of at most
-- 65,536 bytes encoded; DeepSeek's thinking mode, OpenRouter, vLLM, Ollama,
-- Groq) and a tool call's `extra_content` (an object of at most 16,384 bytes
-- encoded, forwarded as parsed: Gemini 3's thought signature). An assistant
-- message with a non-empty tool_calls may carry `content: null`.
local error_body = require "sandbox.providers._error_body"
local json = require "sandbox.json"
local names = require "sandbox.broker._names"
local schema = require "sandbox.broker._schema"

local M = {}

M.REFUSED = "text/function model payload required"
M.MAX_MESSAGES = 128
M.MAX_TOOLS = 128
M.MAX_TOOL_CALLS = 8
M.MAX_REASONING_BYTES = 65536
M.MAX_EXTRA_CONTENT_BYTES = 16384

local ROLES = { system = true, user = true, assistant = true, tool = true }
local MESSAGE_MEMBERS = { role = true, content = true, tool_calls = true, tool_call_id = true,
  reasoning_content = true, reasoning = true }
local MESSAGE_ORDER = { "role", "content", "reasoning_content", "reasoning", "tool_calls", "tool_call_id" }

-- The encoded size of v is at most max bytes.
local function encodes_within(v, max)
  local s = json.encode(v, max)
  return s ~= nil and #s <= max
end

-- An optional reasoning member: nil, or a string within its bound; false
-- when present and refused.
local function reasoning(v)
  if v == nil then return nil end
  if type(v) ~= "string" or not encodes_within(v, M.MAX_REASONING_BYTES) then return false end
  return v
end

local function array_within(v, max)
  return json.kind(v) == "array" and #v <= max
end

local function rebuild_tool_call(call)
  if json.kind(call) ~= "object" or call.type ~= "function" then return nil end
  if not names.call_id(call.id) then return nil end
  local fn = call["function"]
  if json.kind(fn) ~= "object" then return nil end
  if not names.function_name(fn.name) or type(fn.arguments) ~= "string" then return nil end
  local extra = call.extra_content
  if extra ~= nil and (json.kind(extra) ~= "object" or not encodes_within(extra, M.MAX_EXTRA_CONTENT_BYTES)) then
    return nil
  end
  return json.object({ "id", "type", "function", "extra_content" }, {
    id = call.id,
    type = "function",
    ["function"] = json.object({ "name", "arguments" }, { name = fn.name, arguments = fn.arguments }),
    extra_content = extra,
  })
end

local function rebuild_message(msg)
  if json.kind(msg) ~= "object" then return nil end
  for k in pairs(msg) do
    if not MESSAGE_MEMBERS[k] then return nil end
  end
  local role = msg.role
  if type(role) ~= "string" or not ROLES[role] then return nil end
  local calls
  if msg.tool_calls ~= nil then
    if role ~= "assistant" or not array_within(msg.tool_calls, M.MAX_TOOL_CALLS) then return nil end
    calls = json.array()
    for i, call in ipairs(msg.tool_calls) do
      calls[i] = rebuild_tool_call(call)
      if calls[i] == nil then return nil end
    end
  end
  -- content: a string, or null beside a non-empty tool_calls (providers.md 2)
  local content = msg.content
  if type(content) ~= "string" and not (content == json.null and calls and #calls > 0) then return nil end
  local rc, r = reasoning(msg.reasoning_content), reasoning(msg.reasoning)
  if rc == false or r == false then return nil end
  if (rc ~= nil or r ~= nil) and role ~= "assistant" then return nil end
  local call_id = msg.tool_call_id
  if role == "tool" then
    if not names.call_id(call_id) then return nil end
  elseif call_id ~= nil then
    return nil
  end
  return json.object(MESSAGE_ORDER, {
    role = role, content = content, reasoning_content = rc, reasoning = r,
    tool_calls = calls, tool_call_id = call_id,
  })
end

local function rebuild_tool(tool, seen)
  if json.kind(tool) ~= "object" or tool.type ~= "function" then return nil end
  local fn = tool["function"]
  if json.kind(fn) ~= "object" then return nil end
  if not names.function_name(fn.name) or seen[fn.name] then return nil end
  if type(fn.description) ~= "string" then return nil end
  if not schema.parameters_ok(fn.parameters) then return nil end
  seen[fn.name] = true
  return json.object({ "type", "function" }, {
    type = "function",
    ["function"] = json.object({ "name", "description", "parameters" }, {
      name = fn.name, description = fn.description, parameters = fn.parameters,
    }),
  })
end

-- Validates a decoded /model body and returns the forced upstream body as a
-- JSON value, or nil and M.REFUSED.
--   model: the configured model; max_tokens: the broker's output-token cap;
--   field: the member that carries it ("max_tokens" by default, or
--   "max_completion_tokens"; the guest's own value of either is dropped).
function M.rebuild(body, model, max_tokens, field)
  field = field or "max_tokens"
  if json.kind(body) ~= "object" then return nil, M.REFUSED end
  if not array_within(body.messages, M.MAX_MESSAGES) then return nil, M.REFUSED end
  local messages = json.array()
  for i, msg in ipairs(body.messages) do
    messages[i] = rebuild_message(msg)
    if messages[i] == nil then return nil, M.REFUSED end
  end
  local tools
  if body.tools ~= nil then
    if not array_within(body.tools, M.MAX_TOOLS) then return nil, M.REFUSED end
    tools = json.array()
    local seen = {}
    for i, tool in ipairs(body.tools) do
      tools[i] = rebuild_tool(tool, seen)
      if tools[i] == nil then return nil, M.REFUSED end
    end
  end
  return json.object({ "model", "messages", "tools", "stream", field }, {
    model = model, messages = messages, tools = tools, stream = false, [field] = max_tokens,
  })
end

M.MAX_TOKENS = 1 << 40

local function count(v)
  if math.type(v) == "float" and v == math.floor(v) then v = math.tointeger(v) end
  if math.type(v) ~= "integer" or v < 0 or v > M.MAX_TOKENS then return nil end
  return v
end

local function member(obj, name)
  return json.kind(obj) == "object" and obj[name] or nil
end

function M.usage(value)
  local u = member(value, "usage")
  if json.kind(u) ~= "object" then return nil end
  local out = {
    input = count(u.prompt_tokens),
    output = count(u.completion_tokens),
    cached = count(member(u.prompt_tokens_details, "cached_tokens")) or count(u.prompt_cache_hit_tokens),
    reasoning = count(member(u.completion_tokens_details, "reasoning_tokens")),
  }
  if next(out) == nil then return nil end
  return out
end

M.FINISH = { stop = true, length = true, content_filter = true, tool_calls = true, function_call = true }

-- The facts of a decoded reply: whether choices[0] holds a message object,
-- its finish_reason (a known value, or "other"), whether it calls tools.
function M.reply_facts(value)
  local choices = json.kind(value) == "object" and value.choices or nil
  local first = json.kind(choices) == "array" and choices[1] or nil
  local message = json.kind(first) == "object" and first.message or nil
  local facts = { message = json.kind(message) == "object" }
  if json.kind(first) == "object" and type(first.finish_reason) == "string" then
    facts.finish = M.FINISH[first.finish_reason] and first.finish_reason or "other"
  end
  facts.tool_calls = facts.message and json.kind(message.tool_calls) == "array" and #message.tool_calls > 0
  facts.usage = M.usage(value)
  return facts
end

-- The request headers of a model call: JSON both ways, and the credential
-- as modelAuth says ("bearer": Authorization, "api-key": Azure's api-key,
-- "none": nothing).
function M.auth_headers(model_auth, key)
  local headers = { "Content-Type: application/json", "Accept: application/json" }
  if model_auth == "bearer" then headers[#headers + 1] = "Authorization: Bearer " .. key
  elseif model_auth == "api-key" then headers[#headers + 1] = "api-key: " .. key end
  return headers
end

M.error_tokens = error_body.tokens

return M
