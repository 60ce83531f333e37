-- rich/anthropic_spec.lua: the Anthropic request rebuild and the host caps
-- (spec/rich-mode.md 11.1-11.2) as a pure function; the broker specs send
-- the same bodies through the socket to a real upstream.
local anthropic = require "sandbox.providers.anthropic_messages"
local json = require "sandbox.json"

local function rebuild(body, level, count)
  local v = assert(json.decode(type(body) == "string" and body or json.encode(json.jsonable(body))))
  return anthropic.rebuild(v, { model = "claude-sonnet-4-6", maxOutputTokens = 128000, level = level or "high", count_tokens = count })
end

local function ok(body, level, count)
  local out, err = rebuild(body, level, count)
  assert.is_nil(err)
  return json.plain(assert(json.decode(json.encode(out))))
end

local function refused(body, level)
  local out, err = rebuild(body, level)
  assert.is_nil(out)
  return err
end

local USER = { { role = "user", content = "hi" } }

describe("the Anthropic rebuild (11.1)", function()
  it("fixes the model, drops unlisted fields and caps max_tokens", function()
    local r = ok('{"model":"claude-opus","messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"x"},'
      .. '"service_tier":"auto","mcp_servers":[],"container":"c","betas":["x"],"max_tokens":1e6,"stream":true}')
    assert.equal("claude-sonnet-4-6", r.model)
    assert.equal(128000, r.max_tokens)
    assert.is_true(r.stream)
    for _, k in ipairs { "metadata", "service_tier", "mcp_servers", "container", "betas" } do assert.is_nil(r[k]) end
    assert.equal(16384, ok({ messages = USER }).max_tokens)
    assert.is_nil(ok({ messages = USER, stream = "yes" }).stream)
  end)

  it("B56: an ordinary tool_use/tool_result transcript passes", function()
    local r = ok({ messages = {
      { role = "user", content = { { type = "text", text = "roll", cache_control = { type = "ephemeral", ttl = "1h" } } } },
      { role = "assistant", content = { { type = "thinking", thinking = "t", signature = "s", cache_control = { type = "ephemeral" } },
        { type = "tool_use", id = "toolu_1", name = "mcp__custom-tools__dice", input = { n = 2 } } } },
      { role = "user", content = { { type = "tool_result", tool_use_id = "toolu_1", is_error = true,
        content = { { type = "text", text = "4" } } } } },
    }, tools = { { name = "mcp__custom-tools__dice", description = "d", input_schema = { type = "object",
      properties = { n = { type = "integer" } } } } } })
    assert.same({ type = "ephemeral", ttl = "1h" }, r.messages[1].content[1].cache_control)
    assert.is_nil(r.messages[2].content[1].cache_control)
    assert.equal("mcp__custom-tools__dice", r.messages[2].content[2].name)
    assert.is_true(r.messages[3].content[1].is_error)
    assert.equal("mcp__custom-tools__dice", r.tools[1].name)
  end)

  it("B57: native blocks, URL images, remote $ref, native tools and a native tool choice are refused", function()
    assert.equal("Native tools or remote media refused", refused({ messages = {
      { role = "assistant", content = { { type = "server_tool_use", id = "x", name = "web_search", input = {} } } } } }))
    assert.equal("Native tools or remote media refused", refused({ messages = {
      { role = "user", content = { { type = "image", source = { type = "url", url = "https://x/y.png" } } } } } }))
    assert.equal("Remote schema or native tool refused", refused({ messages = USER,
      tools = { { name = "t", input_schema = { ["$ref"] = "https://evil.example/s.json" } } } }))
    assert.equal("Remote schema or native tool refused", refused({ messages = USER,
      tools = { { type = "web_search_20250305", name = "web_search" } } }))
    assert.equal("Invalid tool choice", refused({ messages = USER, tool_choice = { type = "web_search_20250305" } }))
    assert.equal("Invalid tool choice", refused({ messages = USER, tool_choice = { type = "tool", name = "web_search" } }))
  end)

  it("a root $schema naming a JSON Schema meta-schema (as Claude Code sends) passes; any other remote one is refused", function()
    local tool = function(schema) return { messages = USER, tools = { { name = "mcp__custom-tools__t", input_schema = schema } } } end
    local r = ok(tool { type = "object", properties = { q = { type = "string" } }, ["$schema"] = "http://json-schema.org/draft-07/schema#" })
    assert.equal("http://json-schema.org/draft-07/schema#", r.tools[1].input_schema["$schema"])
    assert.equal("Remote schema or native tool refused",
      refused(tool { type = "object", ["$schema"] = "https://evil.example/schema#" }))
    assert.equal("Remote schema or native tool refused", refused(tool { type = "object", properties = {
      q = { type = "string", ["$schema"] = "http://json-schema.org/draft-07/schema#" } } }))
    assert.equal("Remote schema or native tool refused", refused(tool { type = "object",
      ["$schema"] = "http://json-schema.org/draft-07/schema#", properties = { q = { ["$ref"] = "http://x/y" } } }))
  end)

  it("B58: a schema nested deeper than 64 is refused", function()
    -- (the broker's body read refuses JSON nested over 64 first; the walk
    -- holds for any value handed to it)
    local s = json.object({ "type" }, { type = "object" })
    for _ = 1, 64 do
      s = json.object({ "type", "properties" }, { type = "object", properties = json.object({ "x" }, { x = s }) })
    end
    local body = json.object({ "messages", "tools" }, {
      messages = json.array { json.object({ "role", "content" }, { role = "user", content = "hi" }) },
      tools = json.array { json.object({ "name", "input_schema" }, { name = "t", input_schema = s }) },
    })
    local out, err = anthropic.rebuild(body, { model = "m", maxOutputTokens = 128000, level = "high" })
    assert.is_nil(out)
    assert.equal("Remote schema or native tool refused", err)
  end)

  it("B59: a system message keeps text, cache_control and clear_at, drops the rest, caps its effort", function()
    local r = ok({ messages = {
      { role = "system", content = { { type = "text", text = "env", cache_control = { type = "ephemeral" }, extra = 1 } },
        clear_at = "next_user_message", unknown = true, output_config = { effort = "max", format = "x" } },
      { role = "system", content = "plain", clear_at = "sometime" },
      { role = "user", content = "hi" } } }, "low")
    assert.same({ role = "system", content = { { type = "text", text = "env", cache_control = { type = "ephemeral" } } },
      clear_at = "next_user_message", output_config = { effort = "low" } }, r.messages[1])
    assert.same({ role = "system", content = "plain" }, r.messages[2])
  end)

  it("B60/B61: the API-shaped messages for a system tag and an unknown role", function()
    assert.equal("messages.1.content.0: Input tag 'tool_addition' found using 'type' does not match any of the expected tags: 'text'",
      refused({ messages = { { role = "user", content = "a" }, { role = "system", content = { { type = "tool_addition" } } } } }))
    assert.equal("messages.0.content.1: Input tag 'undefined' found using 'type' does not match any of the expected tags: 'text'",
      refused({ messages = { { role = "system", content = { { type = "text", text = "a" }, { x = 1 } } } } }))
    assert.equal("messages.0.content.0: Input tag 'string' found using 'type' does not match any of the expected tags: 'text'",
      refused({ messages = { { role = "system", content = { "a" } } } }))
    local msg = refused({ messages = { { role = "developer", content = "x" } } })
    assert.equal('messages.0: Unexpected role "developer": the input message role must be "user", "assistant" or "system"', msg)
  end)

  it("refuses the shapes of 11.1 with their messages", function()
    assert.equal("Invalid messages", refused({ messages = "x" }))
    assert.equal("Invalid message", refused({ messages = { 5 } }))
    local many = {}
    for i = 1, 257 do many[i] = { type = "text", text = "x" } end
    assert.equal("Invalid content", refused({ messages = { { role = "user", content = many } } }))
    assert.equal("Invalid block", refused({ messages = { { role = "user", content = { "x" } } } }))
    assert.equal("Invalid thinking", refused({ messages = USER, thinking = { type = "enabled", budget_tokens = 1000 } }))
    assert.equal("Invalid thinking", refused({ messages = USER, thinking = { type = "other" } }))
    local tools = {}
    for i = 1, 129 do tools[i] = { name = "t" .. i, input_schema = { type = "object" } } end
    assert.equal("Invalid tools", refused({ messages = USER, tools = tools }))
    assert.equal("Invalid or oversized image", refused({ messages = { { role = "user", content = {
      { type = "image", source = { type = "base64", media_type = "text/plain", data = "aGk=" } } } } } }))
  end)
end)

describe("the thinking and effort caps (11.2)", function()
  local function effort(e, level, thinking)
    return ok({ messages = USER, thinking = thinking or { type = "adaptive", display = "summarized" },
      output_config = e and { effort = e } or nil }, level)
  end

  it("B63: efforts are capped at the host level's ceiling and never raised", function()
    assert.same({ effort = "low" }, effort("max", "low").output_config)
    assert.same({ effort = "medium" }, effort("xhigh", "medium").output_config)
    assert.same({ effort = "xhigh" }, effort("xhigh", "xhigh").output_config)
    assert.same({ effort = "low" }, effort("low", "high").output_config)
    assert.same({ type = "adaptive" }, effort("max", "low").thinking)
  end)

  it("B64: adaptive thinking without effort is forced to low under low, left alone under high", function()
    assert.same({ effort = "low" }, effort(nil, "low").output_config)
    assert.same({ effort = "medium" }, effort(nil, "medium").output_config)
    assert.is_nil(effort(nil, "high").output_config)
  end)

  it("B65: under medium an enabled budget of 120,000 becomes 8,192", function()
    local r = ok({ messages = USER, thinking = { type = "enabled", budget_tokens = 120000 } }, "medium")
    assert.same({ type = "enabled", budget_tokens = 8192 }, r.thinking)
    assert.equal(16384, r.max_tokens)
  end)

  it("B67: under xhigh, max_tokens 64,000 with budget 32,000 is kept, and adaptive with effort max", function()
    local r = ok({ messages = USER, max_tokens = 64000, thinking = { type = "enabled", budget_tokens = 32000 } }, "xhigh")
    assert.equal(64000, r.max_tokens)
    assert.equal(32000, r.thinking.budget_tokens)
    assert.same({ effort = "max" }, effort("max", "xhigh").output_config)
  end)

  it("B68: count_tokens carries no max_tokens; max_tokens 8,192 with budget 32,000 is raised", function()
    local r = ok({ messages = USER, max_tokens = 8192, stream = true, temperature = 0.5 }, "high", true)
    assert.is_nil(r.max_tokens)
    assert.is_nil(r.stream)
    assert.is_nil(r.temperature)
    r = ok({ messages = USER, max_tokens = 8192, thinking = { type = "enabled", budget_tokens = 32000 } }, "xhigh")
    assert.equal(32001, r.max_tokens)
  end)

  it("copies finite sampling numbers and bounded stop sequences, drops the rest silently", function()
    local r = ok({ messages = USER, temperature = 0.2, top_p = 0.9, top_k = 5, stop_sequences = { "a", "b" } })
    assert.same({ 0.2, 0.9, 5 }, { r.temperature, r.top_p, r.top_k })
    assert.same({ "a", "b" }, r.stop_sequences)
    local seq = {}
    for i = 1, 17 do seq[i] = "x" end
    assert.is_nil(ok({ messages = USER, stop_sequences = seq }).stop_sequences)
    assert.is_nil(ok({ messages = USER, stop_sequences = { string.rep("a", 1001) } }).stop_sequences)
  end)
end)
