-- providers/anthropic_messages.lua: the Anthropic Messages wire format
-- (spec/rich-mode.md 11), the one place that knows its fields. The rich
-- broker (rich/broker/_model.lua, _forward.lua) reads what this module
-- returns, never the wire members themselves.
--
--   anthropic.SHAPE        the request body's shape for json.decode_body
--                          (unknown members dropped unread, 11.1)
--   anthropic.rebuild(body, {model, maxOutputTokens, level, count_tokens})
--     -> forced | nil, message
--       field by field (11.1) under the host-judged thinking and effort
--       caps (11.2). Pure: decoded JSON in, an ordered object (or a refusal
--       message) out. Anything not listed is dropped; `model` is always the
--       profile's. The refusal messages are the API-shaped texts the worker
--       sees in a 400 {"type":"error","error":{"type":"invalid_request_error",
--       "message":...}} (anthropic.refusal_body).
--   anthropic.CEILINGS[level] = {effort, budget}
--   anthropic.request_headers(guest, token) -> {name = value}   (11.4: the
--       fixed headers, the OAuth bearer, and the copy list from the worker)
--   anthropic.response_header_kept(name) -> bool   (11.5: content-type,
--       request-id, x-should-retry, retry-after, anthropic-ratelimit-*)
--   anthropic.error_tokens(body, filter) -> {type=, ...}   (the operator's
--       tokens of an error body, providers/_error_body.lua)
local error_body = require "sandbox.providers._error_body"
local json = require "sandbox.json"
local media = require "sandbox.rich._media"
local schema = require "sandbox.broker._schema"
local text = require "sandbox.rich._text"

local M = {}

M.E_MESSAGES = "Invalid messages"
M.E_MESSAGE = "Invalid message"
M.E_CONTENT = "Invalid content"
M.E_BLOCK = "Invalid block"
M.E_NATIVE = "Native tools or remote media refused"
M.E_TOOLS = "Invalid tools"
M.E_TOOL = "Remote schema or native tool refused"
M.E_CHOICE = "Invalid tool choice"
M.E_THINKING = "Invalid thinking"

M.MAX_MESSAGES = 2000
M.MAX_BLOCKS = 256
M.MAX_TOOLS = 128
M.MAX_STOP_SEQUENCES = 16
M.MAX_STOP_CHARS = 1000
M.DEFAULT_MAX_TOKENS = 16384
M.MIN_THINKING_BUDGET = 1024

M.EFFORT_RANK = { low = 0, medium = 1, high = 2, xhigh = 3, max = 4 }
local EFFORT_BY_RANK = { [0] = "low", "medium", "high", "xhigh", "max" }
M.CEILINGS = {
  low = { effort = "low", budget = 2048 },
  medium = { effort = "medium", budget = 8192 },
  high = { effort = "high", budget = 16384 },
  xhigh = { effort = "max", budget = 32768 },
}

local obj, arr, kind = json.object, json.array, json.kind

local function refuse(msg) error({ refusal = msg }, 0) end

local function tool_name_ok(s)
  return type(s) == "string" and #s >= 1 and #s <= 128 and s:find("^[a-zA-Z0-9_-]+$") ~= nil
end

local function as_integer(v)
  if math.type(v) == "integer" then return v end
  if math.type(v) == "float" and v == math.floor(v) and math.abs(v) < 2 ^ 53 then return math.tointeger(v) end
  return nil
end

local function finite(v)
  return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge
end

-- cache_control survives only as {type="ephemeral"} (+ ttl="1h").
local function cache_control(v)
  if kind(v) ~= "object" or v.type ~= "ephemeral" then return nil end
  return obj({ "type", "ttl" }, { type = "ephemeral", ttl = v.ttl == "1h" and "1h" or nil })
end

local function effort_cap(asked, ceiling)
  local a, c = M.EFFORT_RANK[asked], M.EFFORT_RANK[ceiling]
  return EFFORT_BY_RANK[math.min(a, c)]
end

local function valid_effort(v) return type(v) == "string" and M.EFFORT_RANK[v] ~= nil end

-- One content block. nested: inside a tool_result or the top-level system
-- (text and image only).
local function block(b, nested)
  if kind(b) ~= "object" then refuse(M.E_BLOCK) end
  local t = b.type
  if t == "text" then
    if type(b.text) ~= "string" then refuse(M.E_NATIVE) end
    return obj({ "type", "text", "cache_control" }, { type = "text", text = b.text, cache_control = cache_control(b.cache_control) })
  elseif t == "image" then
    local s = b.source
    if kind(s) ~= "object" or s.type ~= "base64" or json.count(s) ~= 3 or type(s.data) ~= "string"
        or type(s.media_type) ~= "string" then
      refuse(M.E_NATIVE)
    end
    local ok, err = media.check_image({ data = s.data, mimeType = s.media_type })
    if not ok then refuse(err) end
    return obj({ "type", "source", "cache_control" }, {
      type = "image",
      source = obj({ "type", "media_type", "data" }, { type = "base64", media_type = s.media_type, data = s.data }),
      cache_control = cache_control(b.cache_control),
    })
  end
  if nested then refuse(M.E_NATIVE) end
  if t == "tool_use" then
    if not text.within(b.id, 1, 128) or not tool_name_ok(b.name) or kind(b.input) ~= "object" then refuse(M.E_NATIVE) end
    return obj({ "type", "id", "name", "input", "cache_control" }, {
      type = "tool_use", id = b.id, name = b.name, input = b.input, cache_control = cache_control(b.cache_control),
    })
  elseif t == "tool_result" then
    if not text.within(b.tool_use_id, 1, 128) then refuse(M.E_NATIVE) end
    local content
    if b.content ~= nil then
      if type(b.content) == "string" then
        content = b.content
      elseif kind(b.content) == "array" then
        if #b.content > M.MAX_BLOCKS then refuse(M.E_CONTENT) end
        content = arr()
        for i = 1, #b.content do content[i] = block(b.content[i], true) end
      else
        refuse(M.E_NATIVE)
      end
    end
    return obj({ "type", "tool_use_id", "content", "is_error", "cache_control" }, {
      type = "tool_result", tool_use_id = b.tool_use_id, content = content,
      is_error = b.is_error == true or nil, cache_control = cache_control(b.cache_control),
    })
  elseif t == "thinking" then
    if type(b.thinking) ~= "string" or type(b.signature) ~= "string" then refuse(M.E_NATIVE) end
    return obj({ "type", "thinking", "signature" }, { type = "thinking", thinking = b.thinking, signature = b.signature })
  elseif t == "redacted_thinking" then
    if type(b.data) ~= "string" then refuse(M.E_NATIVE) end
    return obj({ "type", "data" }, { type = "redacted_thinking", data = b.data })
  end
  refuse(M.E_NATIVE)
end

local function blocks(list, nested)
  if type(list) == "string" then return list end
  if kind(list) ~= "array" or #list > M.MAX_BLOCKS then refuse(M.E_CONTENT) end
  local out = arr()
  for i = 1, #list do out[i] = block(list[i], nested) end
  return out
end

-- The `<type>` of the system-tag message: the type field as text, or what a
-- non-object entry is.
local function tag_of(b)
  local k = kind(b)
  if k == "object" then return text.js_string(b.type) end
  if k == "string" or k == "number" or k == "boolean" then return k end
  return "object"
end

-- A role "system" message (Claude Code's mid-conversation environment).
local function system_message(m, i, ceiling)
  local content = m.content
  if type(content) ~= "string" then
    if kind(content) ~= "array" or #content > M.MAX_BLOCKS then refuse(M.E_CONTENT) end
    local out = arr()
    for j = 1, #content do
      local b = content[j]
      if kind(b) ~= "object" or b.type ~= "text" then
        refuse(string.format("messages.%d.content.%d: Input tag '%s' found using 'type' does not match any of the expected tags: 'text'",
          i - 1, j - 1, tag_of(b)))
      end
      if type(b.text) ~= "string" then refuse(M.E_NATIVE) end
      out[j] = obj({ "type", "text", "cache_control" }, { type = "text", text = b.text, cache_control = cache_control(b.cache_control) })
    end
    content = out
  end
  local clear = (m.clear_at == "next_user_message" or m.clear_at == "never") and m.clear_at or nil
  local oc
  if kind(m.output_config) == "object" and valid_effort(m.output_config.effort) then
    oc = obj({ "effort" }, { effort = effort_cap(m.output_config.effort, ceiling.effort) })
  end
  return obj({ "role", "content", "clear_at", "output_config" }, { role = "system", content = content, clear_at = clear, output_config = oc })
end

local function messages(list, ceiling)
  if kind(list) ~= "array" or #list > M.MAX_MESSAGES then refuse(M.E_MESSAGES) end
  local out = arr()
  for i = 1, #list do
    local m = list[i]
    if kind(m) ~= "object" then refuse(M.E_MESSAGE) end
    if m.role == "system" then
      out[i] = system_message(m, i, ceiling)
    elseif m.role == "user" or m.role == "assistant" then
      out[i] = obj({ "role", "content" }, { role = m.role, content = blocks(m.content, false) })
    else
      refuse(string.format('messages.%d: Unexpected role "%s": the input message role must be "user", "assistant" or "system"',
        i - 1, text.js_string(m.role)))
    end
  end
  return out
end

-- The JSON Schema meta-schemas a tool's root may declare as `$schema`. Claude
-- Code (the worker's bridge) sends every tool with "$schema":
-- "http://json-schema.org/draft-07/schema#" at its root (zod's JSON Schema
-- output), which the page's walk (only "#..." references) would refuse: a
-- root naming one of these well-known meta-schemas is judged without it and
-- forwarded as sent; any other remote `$schema`, and every remote one below
-- the root, is still refused.
M.META_SCHEMAS = {}
for _, draft in ipairs { "draft-04", "draft-06", "draft-07" } do
  for _, scheme in ipairs { "http", "https" } do
    M.META_SCHEMAS[scheme .. "://json-schema.org/" .. draft .. "/schema#"] = true
    M.META_SCHEMAS[scheme .. "://json-schema.org/" .. draft .. "/schema"] = true
  end
end
for _, draft in ipairs { "2019-09", "2020-12" } do
  M.META_SCHEMAS["https://json-schema.org/draft/" .. draft .. "/schema"] = true
end

local function input_schema_ok(s)
  if kind(s) ~= "object" then return false end
  local meta = s["$schema"]
  if type(meta) == "string" and M.META_SCHEMAS[meta] then
    local names, values = {}, {}
    for _, k in ipairs(json.keys(s)) do
      if k ~= "$schema" then names[#names + 1] = k values[k] = s[k] end
    end
    return schema.parameters_ok(json.object(names, values))
  end
  return schema.parameters_ok(s)
end

local function tools(list)
  if list == nil then return nil end
  if kind(list) ~= "array" or #list > M.MAX_TOOLS then refuse(M.E_TOOLS) end
  local out, names = arr(), {}
  for i = 1, #list do
    local t = list[i]
    if kind(t) ~= "object" or (t.type ~= nil and t.type ~= "custom") or not tool_name_ok(t.name)
        or not input_schema_ok(t.input_schema)
        or (t.description ~= nil and type(t.description) ~= "string") then
      refuse(M.E_TOOL)
    end
    names[t.name] = true
    out[i] = obj({ "name", "description", "input_schema", "cache_control" }, {
      name = t.name, description = t.description, input_schema = t.input_schema,
      cache_control = cache_control(t.cache_control),
    })
  end
  return out, names
end

local CHOICES = { auto = true, any = true, tool = true, none = true }

-- A `tool` choice must name one of the forwarded custom tools: a native
-- tool's name never reaches the upstream as a choice.
local function tool_choice(c, names)
  if c == nil then return nil end
  if kind(c) ~= "object" or not CHOICES[c.type] then refuse(M.E_CHOICE) end
  if c.type == "tool" and (not tool_name_ok(c.name) or not (names and names[c.name])) then refuse(M.E_CHOICE) end
  return obj({ "type", "name", "disable_parallel_tool_use" }, {
    type = c.type, name = c.type == "tool" and c.name or nil,
    disable_parallel_tool_use = c.disable_parallel_tool_use == true or nil,
  })
end

-- 11.2: the forwarded thinking and its budget (0 when none).
local function thinking(t, ceiling, max_out)
  if kind(t) ~= "object" then return nil, 0 end
  if t.type == "adaptive" or t.type == "disabled" then return obj({ "type" }, { type = t.type }), 0 end
  if t.type == "enabled" then
    local asked = as_integer(t.budget_tokens)
    if not asked or asked < M.MIN_THINKING_BUDGET then refuse(M.E_THINKING) end
    local budget = math.min(asked, ceiling.budget, max_out - 1)
    return obj({ "type", "budget_tokens" }, { type = "enabled", budget_tokens = budget }), budget
  end
  refuse(M.E_THINKING)
end

local function stop_sequences(v)
  if kind(v) ~= "array" or #v > M.MAX_STOP_SEQUENCES then return nil end
  for i = 1, #v do
    if not text.within(v[i], 0, M.MAX_STOP_CHARS) then return nil end
  end
  return v
end

local FIELDS = { "model", "max_tokens", "messages", "system", "tools", "tool_choice", "thinking",
                 "output_config", "stream", "temperature", "top_p", "top_k", "stop_sequences" }

-- The body's shape for json.decode_body (issue 21): every member build()
-- reads, at every level it rebuilds field by field (the body, a message, a
-- content block, a tool); any other (metadata, service_tier, the guest's
-- model, a block's citations, ...) is dropped unread, as 11.1 drops it from
-- the rebuilt request. What is forwarded or judged whole (an image source:
-- "exactly" three members; a tool input or schema; cache_control) is kept
-- whole, within the decode budget.
local BLOCK = { unknown = "drop", members = {
  type = true, text = true, cache_control = true, source = true, id = true, name = true, input = true,
  tool_use_id = true, is_error = true, thinking = true, signature = true, data = true,
} }
local CONTENT = { items = BLOCK }
BLOCK.members.content = CONTENT                   -- a tool_result's blocks (nested)
local MESSAGE = { unknown = "drop", members = { role = true, content = CONTENT, clear_at = true, output_config = true } }
local TOOL = { unknown = "drop", members = { type = true, name = true, description = true, input_schema = true, cache_control = true } }
M.SHAPE = { unknown = "drop", members = {} }
for _, k in ipairs(FIELDS) do if k ~= "model" then M.SHAPE.members[k] = true end end
M.SHAPE.members.messages = { items = MESSAGE }
M.SHAPE.members.system = CONTENT
M.SHAPE.members.tools = { items = TOOL }

local function build(body, o)
  local ceiling = M.CEILINGS[o.level] or M.CEILINGS.low
  local out = { model = o.model }
  out.messages = messages(body.messages, ceiling)
  if body.system ~= nil then out.system = blocks(body.system, true) end
  local names
  out.tools, names = tools(body.tools)
  out.tool_choice = tool_choice(body.tool_choice, names)
  local budget
  out.thinking, budget = thinking(body.thinking, ceiling, o.maxOutputTokens)
  local oc = body.output_config
  if kind(oc) == "object" and valid_effort(oc.effort) then
    out.output_config = obj({ "effort" }, { effort = effort_cap(oc.effort, ceiling.effort) })
  elseif out.thinking and out.thinking.type == "adaptive" and M.EFFORT_RANK[ceiling.effort] < M.EFFORT_RANK.high then
    out.output_config = obj({ "effort" }, { effort = ceiling.effort })
  end
  if not o.count_tokens then
    local asked = as_integer(body.max_tokens)
    if not asked or asked < 1 then asked = M.DEFAULT_MAX_TOKENS end
    out.max_tokens = math.max(budget + 1, math.min(asked, o.maxOutputTokens))
    out.stream = body.stream == true or nil
    for _, k in ipairs { "temperature", "top_p", "top_k" } do
      if finite(body[k]) then out[k] = body[k] end
    end
    out.stop_sequences = body.stop_sequences ~= nil and stop_sequences(body.stop_sequences) or nil
  end
  return obj(FIELDS, out)
end

function M.rebuild(body, o)
  local ok, res = pcall(build, body, o)
  if ok then return res end
  if type(res) == "table" and res.refusal then return nil, res.refusal end
  error(res, 0)
end

-- The 400 body of a refusal.
function M.refusal_body(message)
  return json.encode(obj({ "type", "error" }, {
    type = "error",
    error = obj({ "type", "message" }, { type = "invalid_request_error", message = message }),
  }))
end

-- 11.4: the fixed headers and the copy list (a copied value replaces the
-- fixed one of that name). Values with control characters are not copied.
M.COPY = { "anthropic-version", "anthropic-beta", "content-type", "accept", "user-agent", "x-app" }
M.MAX_COPY = 4096

function M.request_headers(guest, token)
  local h = {
    ["content-type"] = "application/json",
    accept = "application/json, text/event-stream",
    ["accept-encoding"] = "identity",
    authorization = "Bearer " .. token,
  }
  for _, name in ipairs(M.COPY) do
    local v = guest[name]
    if type(v) == "string" and #v <= M.MAX_COPY and not v:find("[%c]") then h[name] = v end
  end
  return h
end

-- 11.5: the response headers that reach the worker (the caller still bounds
-- their values and checks them for the credential).
local KEEP = { ["content-type"] = true, ["request-id"] = true, ["x-should-retry"] = true, ["retry-after"] = true }

function M.response_header_kept(name)
  return KEEP[name] == true or name:find("^anthropic%-ratelimit%-") ~= nil
end

-- Issue 26: the headers of the rich broker's final error answer (the host
-- already retried): the kept ones minus the upstream's own content type and
-- retry hints, then NO_RETRY (the Anthropic SDKs' signal to give up).
M.NO_RETRY = { ["x-should-retry"] = "false" }
local NOT_FINAL = { ["content-type"] = true, ["x-should-retry"] = true, ["retry-after"] = true }

function M.final_header_kept(name)
  return not NOT_FINAL[name] and M.response_header_kept(name)
end

M.error_tokens = error_body.tokens

return M
