-- broker/_model_payload.lua: /model request validation and rebuild (spec/broker.md
-- sections 9.1-9.5). The guest's body is never forwarded: a new body is built
-- from the members that passed, in a fixed order, with the configured model
-- and the forced output-token cap. Anything unexpected refuses the whole
-- request (400 before any credential or upstream contact).
local json = require "sandbox.json"
local names = require "sandbox.broker._names"
local schema = require "sandbox.broker._schema"

local M = {}

M.REFUSED = "text/function model payload required"
M.MAX_MESSAGES = 128
M.MAX_TOOLS = 128
M.MAX_TOOL_CALLS = 8

local ROLES = { system = true, user = true, assistant = true, tool = true }
local MESSAGE_MEMBERS = { role = true, content = true, tool_calls = true, tool_call_id = true }

local function array_within(v, max)
  return json.kind(v) == "array" and #v <= max
end

local function rebuild_tool_call(call)
  if json.kind(call) ~= "object" or call.type ~= "function" then return nil end
  if not names.call_id(call.id) then return nil end
  local fn = call["function"]
  if json.kind(fn) ~= "object" then return nil end
  if not names.function_name(fn.name) or type(fn.arguments) ~= "string" then return nil end
  return json.object({ "id", "type", "function" }, {
    id = call.id,
    type = "function",
    ["function"] = json.object({ "name", "arguments" }, { name = fn.name, arguments = fn.arguments }),
  })
end

local function rebuild_message(msg)
  if json.kind(msg) ~= "object" then return nil end
  for k in pairs(msg) do
    if not MESSAGE_MEMBERS[k] then return nil end
  end
  local role = msg.role
  if type(role) ~= "string" or not ROLES[role] then return nil end
  if type(msg.content) ~= "string" then return nil end
  local calls
  if msg.tool_calls ~= nil then
    if role ~= "assistant" or not array_within(msg.tool_calls, M.MAX_TOOL_CALLS) then return nil end
    calls = json.array()
    for i, call in ipairs(msg.tool_calls) do
      calls[i] = rebuild_tool_call(call)
      if calls[i] == nil then return nil end
    end
  end
  local call_id = msg.tool_call_id
  if role == "tool" then
    if not names.call_id(call_id) then return nil end
  elseif call_id ~= nil then
    return nil
  end
  return json.object({ "role", "content", "tool_calls", "tool_call_id" }, {
    role = role, content = msg.content, tool_calls = calls, tool_call_id = call_id,
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
--   model: the configured model; max_tokens: the broker's output-token cap.
function M.rebuild(body, model, max_tokens)
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
  return json.object({ "model", "messages", "tools", "stream", "max_tokens" }, {
    model = model, messages = messages, tools = tools, stream = false, max_tokens = max_tokens,
  })
end

return M
