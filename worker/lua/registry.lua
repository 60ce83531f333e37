-- registry.lua: the function registry and the `tools` array
-- (spec/worker.md 5.1 step 6, 5.2, 7.6). Order: invalid_tool, the three
-- memory tools, host_<name> per host tool, mcp_<i>_<tool> per MCP tool.
local codec = require "codec"

local M = {}

M.MAX_FUNCTIONS = 128
M.MAX_TOOLS_BYTES = 32768

local obj, arr = codec.object, codec.array

local function string_schema()
  return obj({ "type" }, { type = "string" })
end

local function scope_schema()
  return obj({ "type", "enum" }, { type = "string", enum = arr { "speaker", "channel" } })
end

local function schema(props, required)
  local names, values = {}, {}
  for _, p in ipairs(props) do
    names[#names + 1] = p[1]
    values[p[1]] = p[2]
  end
  return obj({ "type", "properties", "required", "additionalProperties" }, {
    type = "object", properties = obj(names, values), required = required and arr(required),
    additionalProperties = false,
  })
end

-- The four built-ins; run is filled in by build().
local function builtins()
  return {
    { name = "invalid_tool",
      description = "Placeholder for an earlier tool call that was malformed or named an unavailable "
        .. "tool. It always refuses; pick one of the declared tools instead.",
      parameters = schema({}, nil) },
    { name = "memory_set",
      description = "Remember a fact about the current speaker (scope speaker) or a shared channel "
        .. "note (scope channel) under a key.",
      parameters = schema({ { "scope", scope_schema() }, { "key", string_schema() },
                            { "text", string_schema() } }, { "scope", "key", "text" }) },
    { name = "memory_get",
      description = "Read or search the current speaker's facts or the shared channel notes; omit "
        .. "the key to list them, give a query to search.",
      parameters = schema({ { "scope", scope_schema() }, { "key", string_schema() },
                            { "query", string_schema() } }, { "scope" }) },
    { name = "memory_remove",
      description = "Forget one fact of the current speaker or one shared channel note by key.",
      parameters = schema({ { "scope", scope_schema() }, { "key", string_schema() } },
                          { "scope", "key" }) },
  }
end

-- Function names the model sees: ^[a-z][a-z0-9_]{0,63}$.
function M.valid_function_name(s)
  return type(s) == "string" and #s <= 64 and s:match("^[a-z][a-z0-9_]*$") ~= nil
end

-- build(turn, h) -> registry, or nil, error. h supplies the handlers:
--   h.refuse(args)                 invalid_tool
--   h.memory(name, args)           the three memory tools
--   h.host(tool_name, args)        POST /tools/<tool_name>
--   h.mcp(server, tool_name, args) POST /mcp/<server>
-- Each returns result text or nil, error. The registry is
-- {list = {entry...}, by_name = {name = entry}, tools = <tools array>}.
function M.build(turn, h)
  local list = builtins()
  list[1].run = h.refuse
  for i = 2, 4 do
    local name = list[i].name
    list[i].run = function(args) return h.memory(name, args) end
  end
  for _, t in ipairs(turn.tools) do
    local name = t.name
    list[#list + 1] = { name = "host_" .. name, description = t.description, parameters = t.parameters,
                        run = function(args) return h.host(name, args) end }
  end
  for i, server in ipairs(turn.mcp) do
    for _, t in ipairs(server.tools) do
      local sname, tname = server.server, t.name
      list[#list + 1] = { name = "mcp_" .. (i - 1) .. "_" .. tname, description = t.description,
                          parameters = t.parameters,
                          run = function(args) return h.mcp(sname, tname, args) end }
    end
  end
  local by_name = {}
  for _, e in ipairs(list) do
    if by_name[e.name] or not M.valid_function_name(e.name) then return nil, "invalid turn" end
    by_name[e.name] = e
  end
  if #list > M.MAX_FUNCTIONS then return nil, "tool descriptions exceed context budget" end
  local tools = arr()
  for _, e in ipairs(list) do
    tools[#tools + 1] = obj({ "type", "function" }, {
      type = "function",
      ["function"] = obj({ "name", "description", "parameters" },
                         { name = e.name, description = e.description, parameters = e.parameters }),
    })
  end
  if #codec.encode(tools) > M.MAX_TOOLS_BYTES then
    return nil, "tool descriptions exceed context budget"
  end
  return { list = list, by_name = by_name, tools = tools }
end

return M
